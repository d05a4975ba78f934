"""Costs in the usage reports of a real server with priced models: what `/admin/usage`, `/admin/usage/series` and
`tokenrelay usage --json` say equals the prices times each ledger row's own token counts, and a price change
(a restart with new prices) leaves the rows charged before it as they were."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from decimal import ROUND_HALF_UP, Decimal
from pathlib import Path
from typing import Any

import pytest
import yaml
from accounting_support import cli, ledger_rows, sqlite_url
from servers import Server, start_server

from tokenrelay.pricing.cost import money

ADMIN_KEY = "admin-key-for-usage-cost-tests-7c2a"
PRICED, UNPRICED = "gemma-3-270m", "smollm2-135m-instruct"
CURRENCY = "EUR"
# Per million tokens; fractional micro-units per token, so a call's cost is rounded.
FIRST_PRICES = {PRICED: {"input": "1.5", "cached_input": "0.25", "output": "6.125"}}
SECOND_PRICES = {
    PRICED: {"input": "2", "cached_input": "0.5", "output": "10"},
    UNPRICED: {"input": "0.3", "output": "0.9"},
}
PROMPT = "List three colours of the rainbow, one per line, and say nothing else at all please."


@dataclass
class Gateway:
    tmp: Path
    url: str
    config: Path
    server: Server
    key: str = ""

    def admin(self, path: str, **params: str) -> dict[str, Any]:
        with self.server.http(headers={"Authorization": f"Bearer {ADMIN_KEY}"}) as http:
            response = http.get(path, params=params)
        assert response.status_code == 200, response.text
        return response.json()


def _config(tmp: Path, prices: dict[str, dict[str, str]], name: str) -> Path:
    models = [{"id": model, **({"pricing": prices[model]} if model in prices else {})} for model in (PRICED, UNPRICED)]
    path = tmp / name
    path.write_text(yaml.safe_dump({"admin_key": ADMIN_KEY, "currency": CURRENCY, "models": models}))
    return path


def _start(tmp: Path, config: Path, url: str) -> Server:
    return start_server(tmp, "--config", str(config), "--database-url", url)


def _create_key(server: Server) -> str:
    with server.http(headers={"Authorization": f"Bearer {ADMIN_KEY}"}) as admin:
        response = admin.post("/admin/keys", json={"name": "app"})
    assert response.status_code == 201, response.text
    return response.json()["key"]


def _traffic(gateway: Gateway) -> None:
    """Chat twice with one prompt (the engine may answer the second from its prompt cache), a stream, a
    completion with two choices, and the unpriced model."""
    client = gateway.server.client(api_key=gateway.key)
    messages = [{"role": "user", "content": PROMPT}]
    for _ in range(2):
        client.chat.completions.create(model=PRICED, messages=messages, max_tokens=6)
    stream = client.chat.completions.create(
        model=PRICED, messages=messages, max_tokens=5, stream=True, stream_options={"include_usage": True}
    )
    assert any(chunk.usage for chunk in stream)
    client.completions.create(model=PRICED, prompt="Once upon a time", max_tokens=4, n=2)
    client.chat.completions.create(model=UNPRICED, messages=messages, max_tokens=4)


def _expected_micros(row: dict[str, Any], prices: dict[str, str] | None) -> int:
    """prices x counts, in Decimal: a token at a price per million costs that price in micro-units."""
    if prices is None:
        return 0
    cached = min(row["cached_tokens"], row["prompt_tokens"])
    exact = (
        (row["prompt_tokens"] - cached) * Decimal(prices["input"])
        + cached * Decimal(prices.get("cached_input", prices["input"]))
        + row["completion_tokens"] * Decimal(prices["output"])
    )
    return int(exact.quantize(Decimal(1), rounding=ROUND_HALF_UP))


def _flushed_rows(gateway: Gateway) -> list[dict[str, Any]]:
    gateway.admin("/admin/usage")  # writes the server's queued ledger rows
    return ledger_rows(gateway.url)


def _by_model(rows: list[dict[str, Any]]) -> dict[str, dict[str, int]]:
    found: dict[str, dict[str, int]] = {}
    for row in rows:
        group = found.setdefault(row["model"], {"requests": 0, "cost_micros": 0, "unpriced_requests": 0, "tokens": 0})
        group["requests"] += 1
        group["cost_micros"] += row["cost"]
        group["unpriced_requests"] += not row["priced"]
        group["tokens"] += row["prompt_tokens"] + row["completion_tokens"]
    return found


def _expect_report(report: dict[str, Any], rows: list[dict[str, Any]]) -> None:
    assert report["currency"] == CURRENCY
    groups = {group["model"]: group for group in report["groups"]}
    for model, want in _by_model(rows).items():
        group = groups[model]
        assert group["requests"] == want["requests"] and group["total_tokens"] == want["tokens"], model
        assert group["cost_micros"] == want["cost_micros"], model
        assert group["cost"] == money(want["cost_micros"]), model
        assert group["unpriced_requests"] == want["unpriced_requests"], model
    total = sum(row["cost"] for row in rows)
    assert (report["totals"]["cost_micros"], report["totals"]["cost"]) == (total, money(total))
    assert report["totals"]["unpriced_requests"] == sum(not row["priced"] for row in rows)


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    tmp = tmp_path_factory.mktemp("usage-costs")
    url, config = sqlite_url(tmp), _config(tmp, FIRST_PRICES, "first.yaml")
    running = Gateway(tmp, url, config, _start(tmp, config, url))
    try:
        running.key = _create_key(running.server)
        _traffic(running)
        yield running
    finally:
        running.server.stop()


def test_ledger_costs_are_prices_times_each_rows_counts(gateway: Gateway) -> None:
    rows = _flushed_rows(gateway)
    assert len(rows) == 5
    assert all(row["status"] == 200 for row in rows)
    assert sum(row["completion_tokens"] for row in rows if row["endpoint"] == "completions") > 4  # two choices
    for row in rows:
        assert row["cost"] == _expected_micros(row, FIRST_PRICES.get(row["model"])), row
        assert bool(row["priced"]) == (row["model"] == PRICED)
    assert all(row["cost"] > 0 for row in rows if row["model"] == PRICED)
    assert any(row["cached_tokens"] for row in rows if row["model"] == PRICED)  # priced at `cached_input`


def test_admin_usage_and_the_cli_report_the_ledgers_costs(gateway: Gateway) -> None:
    rows = _flushed_rows(gateway)
    api = gateway.admin("/admin/usage", by="model")
    _expect_report(api, rows)
    assert {g["model"]: g["unpriced_requests"] for g in api["groups"]} == {PRICED: 0, UNPRICED: 1}
    cli_report = json.loads(
        cli("usage", "--by", "model", "--json", "--config", str(gateway.config), url=gateway.url).stdout
    )
    assert cli_report["totals"] == api["totals"] and cli_report["groups"] == api["groups"]
    assert cli_report["currency"] == CURRENCY

    table = cli("usage", "--by", "model", "--config", str(gateway.config), url=gateway.url).stdout
    assert f"COST_{CURRENCY}" in table and api["totals"]["cost"] in table
    assert "1 of 5 requests were served by models without prices" in table

    by_key = gateway.admin("/admin/usage", by="key")["groups"]
    assert [(g["key_name"], g["cost_micros"]) for g in by_key] == [("app", sum(row["cost"] for row in rows))]


def test_usage_series_carry_the_same_costs(gateway: Gateway) -> None:
    rows = _flushed_rows(gateway)
    series = gateway.admin("/admin/usage/series", by="model")
    assert series["currency"] == CURRENCY
    models = {entry["model"]: entry for entry in series["series"]}
    for model, want in _by_model(rows).items():
        summary = models[model]["summary"]
        assert (summary["cost_micros"], summary["cost"]) == (want["cost_micros"], money(want["cost_micros"]))
        assert sum(models[model]["cost_micros"]) == want["cost_micros"]
    assert series["total"]["summary"]["unpriced_requests"] == 1


def test_a_price_change_applies_from_then_on(gateway: Gateway) -> None:
    before = {row["id"]: row for row in _flushed_rows(gateway)}
    gateway.server.stop()
    config = _config(gateway.tmp, SECOND_PRICES, "second.yaml")
    gateway.server, gateway.config = _start(gateway.tmp, config, gateway.url), config
    client = gateway.server.client(api_key=gateway.key)
    messages = [{"role": "user", "content": PROMPT}]
    for model in (PRICED, UNPRICED):
        client.chat.completions.create(model=model, messages=messages, max_tokens=6)

    rows = _flushed_rows(gateway)
    assert len(rows) == len(before) + 2
    for row in rows:
        if row["id"] in before:
            assert (row["cost"], row["priced"]) == (before[row["id"]]["cost"], before[row["id"]]["priced"])
        else:
            assert row["priced"] and row["cost"] == _expected_micros(row, SECOND_PRICES[row["model"]]), row
    report = gateway.admin("/admin/usage", by="model")
    _expect_report(report, rows)
    assert report["totals"]["unpriced_requests"] == 1  # the first server's call to the then unpriced model
