"""`/admin/usage/series` and the `/console/usage` page, against ledger rows written by real requests.

The series are checked on SQLite and on PostgreSQL; the page in headless Chromium on SQLite. The model is
priced, so the page's costs can be checked against the cost each ledger row was charged.
"""

from __future__ import annotations

import math
import re
from collections import defaultdict
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import yaml
from accounting_support import FAST_CACHE, cli, ledger_rows, postgres_database, sqlite_url
from observing import eventually
from playwright.sync_api import Browser, Page
from servers import DEFAULT_MODEL, Server, start_server

from tokenrelay.console import pages

ADMIN_ENV_KEY = "operator-secret-for-usage-tests"
KEYS: dict[str, dict[str, Any]] = {
    "ops": {"admin": True},
    "alpha": {"budget_tokens": 1000, "rpm": 600},
    "beta": {"tpm": 100_000},
    "tiny": {"budget_tokens": 5},  # too small for any request: its one request is refused and recorded
    "plain": {},
}
TRAFFIC = {"alpha": 3, "beta": 2, "tiny": 1}
CURRENCY = "EUR"
PRICING = {"input": "2.5", "cached_input": "1.25", "output": "10"}  # per million tokens
PAGE_TIMEOUT_MS = 30_000


@dataclass
class Deployment:
    server: Server
    url: str
    keys: dict[str, str]
    rows: list[dict[str, Any]]  # the ledger after the traffic below

    def http(self, key: str | None = None) -> httpx.Client:
        headers = {} if key is None else {"Authorization": f"Bearer {self.keys.get(key, key)}"}
        return self.server.http(headers=headers)

    def series(self, **params: str) -> dict[str, Any]:
        with self.http("ops") as admin:
            response = admin.get("/admin/usage/series", params=params)
        assert response.status_code == 200, response.text
        return response.json()


def _send_traffic(server: Server, keys: dict[str, str]) -> None:
    """Tiny requests through the official client: chat (one streamed) and completions, and one refusal."""
    alpha = server.client(api_key=keys["alpha"])
    messages = [{"role": "user", "content": "Hi"}]
    for _ in range(TRAFFIC["alpha"] - 1):
        alpha.chat.completions.create(model=DEFAULT_MODEL, messages=messages, max_tokens=2)
    stream = alpha.chat.completions.create(
        model=DEFAULT_MODEL, messages=messages, max_tokens=2, stream=True, stream_options={"include_usage": True}
    )
    assert any(chunk.usage for chunk in stream)
    beta = server.client(api_key=keys["beta"])
    for _ in range(TRAFFIC["beta"]):
        beta.completions.create(model=DEFAULT_MODEL, prompt="Hello", max_tokens=1)
    with pytest.raises(openai.RateLimitError):
        server.client(api_key=keys["tiny"]).completions.create(model=DEFAULT_MODEL, prompt="Hello", max_tokens=3)


def _create_key(server: Server, name: str, spec: dict[str, Any]) -> str:
    with server.http(headers={"Authorization": f"Bearer {ADMIN_ENV_KEY}"}) as admin:
        response = admin.post("/admin/keys", json={"name": name, **spec})
    assert response.status_code == 201, response.text
    return response.json()["key"]


def _priced_config(tmp: Path) -> Path:
    path = tmp / "priced.yaml"
    path.write_text(yaml.safe_dump({"currency": CURRENCY, "models": [{"id": DEFAULT_MODEL, "pricing": PRICING}]}))
    return path


def _deploy(tmp: Path, url: str) -> Iterator[Deployment]:
    env = {**FAST_CACHE, "TOKENRELAY_ADMIN_KEY": ADMIN_ENV_KEY}
    server = start_server(tmp, "--config", str(_priced_config(tmp)), "--database-url", url, env=env)
    try:
        keys = {name: _create_key(server, name, spec) for name, spec in KEYS.items()}
        _send_traffic(server, keys)
        deployment = Deployment(server, url, keys, [])
        with deployment.http("ops") as admin:
            assert admin.get("/admin/usage").status_code == 200  # writes the server's queued ledger rows
        # In a thread of its own: while a browser is open, Playwright's sync API keeps an event loop in this
        # one, where the query's asyncio.run() would refuse to start.
        with ThreadPoolExecutor(1) as thread:
            deployment.rows = thread.submit(ledger_rows, url).result()
        assert len(deployment.rows) == sum(TRAFFIC.values())
        yield deployment
    finally:
        server.stop()


@pytest.fixture(scope="module")
def sqlite_deployment(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    tmp = tmp_path_factory.mktemp("usage-sqlite")
    yield from _deploy(tmp, sqlite_url(tmp))


@pytest.fixture(scope="module")
def postgresql_deployment(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    with postgres_database() as url:
        yield from _deploy(tmp_path_factory.mktemp("usage-postgresql"), url)


@pytest.fixture(params=["sqlite", "postgresql"])
def deployment(request: pytest.FixtureRequest) -> Deployment:
    return request.getfixturevalue(f"{request.param}_deployment")


# What the series should say, worked out from the ledger rows -----------------------------------------
def _started(row: dict[str, Any]) -> datetime:
    value = row["started_at"]  # SQLite hands raw text back to a textual query
    return value if isinstance(value, datetime) else datetime.fromisoformat(value)


def _instant(text: str) -> datetime:
    return datetime.fromisoformat(text.removesuffix("Z"))


def _nearest_rank(values: list[float], percentile: int) -> float | None:
    ordered = sorted(values)
    return round(ordered[math.ceil(percentile / 100 * len(ordered)) - 1], 1) if ordered else None


def _expect_figures(figures: dict[str, Any], rows: list[dict[str, Any]], index: int | None = None) -> None:
    """Series figures (one bucket's, or the summary's when `index` is None) against the rows they cover."""

    def at(values: Any) -> Any:
        return values if index is None else values[index]

    assert at(figures["requests"]) == len(rows)
    for name in ("prompt_tokens", "completion_tokens", "cached_tokens"):
        assert at(figures[name]) == sum(r[name] for r in rows), name
    assert at(figures["failed"]) == sum(r["status"] >= 400 for r in rows)
    assert at(figures["cost_micros"]) == sum(r["cost"] for r in rows)
    assert at(figures["unpriced_requests"]) == sum(not r["priced"] for r in rows)
    answered = [r for r in rows if r["status"] < 400]
    for p in (50, 95, 99):
        assert at(figures["latency_ms"][f"p{p}"]) == _nearest_rank([r["latency_ms"] for r in answered], p)
        assert at(figures["ttft_ms"][f"p{p}"]) == _nearest_rank([r["ttft_ms"] for r in answered], p)


def _expect_series(entry: dict[str, Any], rows: list[dict[str, Any]], since: datetime, size: int) -> None:
    in_bucket: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for row in rows:
        in_bucket[(_started(row) - since) // timedelta(hours=1)].append(row)
    assert set(in_bucket) <= set(range(size))
    for index in range(size):
        _expect_figures(entry, in_bucket[index], index)
    _expect_figures(entry["summary"], rows)
    assert entry["summary"]["total_tokens"] == _tokens(rows)


def _tokens(rows: list[dict[str, Any]]) -> int:
    return sum(r["prompt_tokens"] + r["completion_tokens"] for r in rows)


def _cost(rows: list[dict[str, Any]]) -> Decimal:
    """What the rows were charged, in units of the currency (exact)."""
    return Decimal(sum(r["cost"] for r in rows)).scaleb(-6)


def _rows_of(deployment: Deployment, key: str) -> list[dict[str, Any]]:
    return [r for r in deployment.rows if r["key_name"] == key]


# The series endpoint -----------------------------------------------------------------------------------
def test_series_by_key_per_hour_match_the_ledger(deployment: Deployment) -> None:
    series = deployment.series(by="key")
    since = _instant(series["since"])
    assert (series["object"], series["bucket"], series["by"]) == ("usage_series", "hour", "key")
    assert series["currency"] == CURRENCY
    assert len(series["buckets"]) == 24 and series["buckets"][0] == series["since"]
    assert _instant(series["until"]) - since == timedelta(hours=24)
    assert since <= min(map(_started, deployment.rows)) and max(map(_started, deployment.rows)) < _instant(
        series["until"]
    )
    assert [entry["key_name"] for entry in series["series"]] == ["alpha", "beta", "tiny"]  # most tokens first
    for entry in series["series"]:
        assert len(entry["requests"]) == 24
        _expect_series(entry, _rows_of(deployment, entry["key_name"]), since, 24)
    _expect_series(series["total"], deployment.rows, since, 24)
    assert series["total"]["summary"]["failed"] == 1  # tiny's refusal


def test_series_by_model_filters_and_the_rest_summed(deployment: Deployment) -> None:
    by_model = deployment.series(by="model", bucket="day")
    assert len(by_model["buckets"]) == 30
    ((entry,),) = [by_model["series"]]
    assert entry["model"] == DEFAULT_MODEL
    assert entry["summary"] == by_model["total"]["summary"]
    assert entry["summary"]["requests"] == len(deployment.rows)

    alpha = deployment.series(key="alpha", bucket="day", since=by_model["buckets"][-1])
    assert len(alpha["buckets"]) == 1 and alpha["series"] == []
    _expect_figures(alpha["total"]["summary"], _rows_of(deployment, "alpha"))

    first, other = deployment.series(by="key", limit="1")["series"]
    assert first["key_name"] == "alpha" and other["other"] == 2
    assert first["summary"]["requests"] + other["summary"]["requests"] == len(deployment.rows)
    _expect_figures(other["summary"], _rows_of(deployment, "beta") + _rows_of(deployment, "tiny"))

    past = deployment.series(since="2020-01-01", until="2020-01-03T05:00:00", bucket="day")
    assert len(past["buckets"]) == 3 and past["total"]["summary"]["requests"] == 0


@pytest.mark.parametrize(
    ("params", "param"),
    [
        ({"bucket": "week"}, "bucket"),
        ({"by": "colour"}, "by"),
        ({"limit": "0"}, "limit"),
        ({"limit": "x"}, "limit"),
        ({"since": "last tuesday"}, "since"),
        ({"since": "2020-01-01"}, "since"),  # years of hours: more buckets than allowed
        ({"since": "2020-01-02", "until": "2020-01-01", "bucket": "day"}, "since"),
    ],
)
def test_series_refuses_bad_parameters(sqlite_deployment: Deployment, params: dict[str, str], param: str) -> None:
    with sqlite_deployment.http("ops") as admin:
        response = admin.get("/admin/usage/series", params=params)
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == param


def test_series_need_an_admin_key(sqlite_deployment: Deployment) -> None:
    with sqlite_deployment.http() as anonymous:
        assert anonymous.get("/admin/usage/series").status_code == 401
    with sqlite_deployment.http("plain") as ordinary:
        refused = ordinary.get("/admin/usage/series")
    assert refused.status_code == 403 and refused.json()["error"]["code"] == "permission_denied"
    with sqlite_deployment.http(ADMIN_ENV_KEY) as operator:
        assert operator.get("/admin/usage/series").status_code == 200


# The page ------------------------------------------------------------------------------------------------
def test_usage_page_and_its_assets_ship_in_the_package(sqlite_deployment: Deployment) -> None:
    with sqlite_deployment.http() as http:  # the page holds no data, so it needs no key
        page = http.get("/console/usage")
        assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
        assert page.headers["cache-control"] == "no-cache"
        assets = set(re.findall(r'(?:src|href)="(/console/static/[^"]+)"', page.text))
        assert assets == {"/console/static/console.css", "/console/static/usage.js"}
        shipped = sorted(p.name for p in pages.page_path("usage.html").parent.iterdir())
        for name in shipped:
            asset = http.get(f"/console/static/{name}")
            assert asset.status_code == 200, name
            assert "http://" not in asset.text and "https://" not in asset.text, name
            for imported in re.findall(r'from "\./([^"]+)"', asset.text):
                assert imported in shipped, (name, imported)


@dataclass
class UsageTab:
    page: Page
    deployment: Deployment
    urls: list[str]
    errors: list[str]

    def open(self) -> None:
        self.page.goto(f"{self.deployment.server.base_url}/console/usage")
        self.page.wait_for_selector("#key-dialog[open]")

    def give_key(self, key: str) -> None:
        self.page.fill("#key-input", self.deployment.keys[key])
        self.page.click("#key-ok")

    def drawn(self, chart: str, shape: str) -> dict[str, list[float]]:
        """Values drawn in a chart, per series, read back from the SVG."""
        script = "els => els.map(e => [e.dataset.series, Number(e.dataset.value)])"
        found: dict[str, list[float]] = defaultdict(list)
        for series, value in self.page.eval_on_selector_all(f"#chart-{chart} {shape}", script):
            found[series].append(value)
        return dict(found)

    def cell(self, key: str, column: str) -> Any:
        return self.text(f"#keys tr[data-key={key}] td.{column}")

    def text(self, selector: str) -> Any:
        return self.page.eval_on_selector(selector, "e => e.textContent.trim()")

    def column(self, table: str, column: str) -> dict[str, str]:
        """A column of the totals by model or by day, per row."""
        script = f"rows => rows.map(r => [r.dataset.group, r.querySelector('td.{column}').textContent])"
        return dict(self.page.eval_on_selector_all(f"#{table} tbody tr", script))


@pytest.fixture
def tab(browser: Browser, sqlite_deployment: Deployment) -> Iterator[UsageTab]:
    context = browser.new_context(viewport={"width": 1280, "height": 1300})
    context.set_default_timeout(PAGE_TIMEOUT_MS)
    usage_tab = UsageTab(context.new_page(), sqlite_deployment, [], [])
    usage_tab.page.on("request", lambda request: usage_tab.urls.append(request.url))
    usage_tab.page.on("pageerror", lambda error: usage_tab.errors.append(str(error)))
    yield usage_tab
    context.close()


def test_usage_page_refuses_a_key_that_is_not_an_admin_key(tab: UsageTab) -> None:
    tab.open()
    with tab.page.expect_response("**/admin/usage/series?*") as answer:
        tab.give_key("plain")
    assert answer.value.status == 403
    tab.page.wait_for_selector("#key-dialog[open]")
    assert "admin key" in tab.page.inner_text("#key-note")
    tab.page.click("#key-dialog button[value=cancel]")
    tab.page.wait_for_selector("#dashboard[data-state=empty]")
    assert "admin key" in tab.page.inner_text("#notice")
    assert tab.page.evaluate("sessionStorage.getItem('tokenrelay.adminKey')") is None  # a refused key is not kept
    assert tab.page.eval_on_selector_all(".chart svg *", "els => els.length") == 0
    assert tab.page.eval_on_selector_all("#keys tbody tr", "rows => rows.length") == 0
    assert not tab.errors


def test_usage_page_charts_the_ledger_and_lists_budgets(tab: UsageTab, tmp_path: Path) -> None:
    deployment = tab.deployment
    tab.open()
    tab.give_key("ops")
    tab.page.wait_for_selector("#dashboard[data-state=ready]")
    assert tab.page.evaluate("sessionStorage.getItem('tokenrelay.adminKey')") == deployment.keys["ops"]
    assert tab.page.evaluate("localStorage.length") == 0

    tokens = {key: _tokens(_rows_of(deployment, key)) for key in TRAFFIC}
    assert {k: sum(v) for k, v in tab.drawn("requests", "rect.bar").items()} == TRAFFIC
    assert {k: sum(v) for k, v in tab.drawn("tokens", "rect.bar").items()} == {k: t for k, t in tokens.items() if t}
    errors = tab.drawn("errors", "circle")
    assert set(errors["tiny"]) == {100} and set(errors["alpha"]) == set(errors["beta"]) == {0}
    latency = tab.drawn("latency", "circle")
    total = deployment.series()["total"]["latency_ms"]
    assert {p: sorted(latency[p]) for p in latency} == {p: sorted(v for v in total[p] if v is not None) for p in total}
    assert max(latency["p99"]) == _nearest_rank([r["latency_ms"] for r in deployment.rows if r["status"] < 400], 99)
    assert tab.page.inner_text("[data-tile=Requests] .value") == str(len(deployment.rows))

    assert tab.cell("alpha", "left").startswith(f"{1000 - tokens['alpha']} (")
    assert tab.cell("tiny", "left") == "5 (100%)" and tab.cell("beta", "left") == "unlimited"
    for key, requests in TRAFFIC.items():
        assert tab.cell(key, "requests") == str(requests)
    assert tab.cell("ops", "state") == "active · admin" and tab.cell("plain", "requests") == "0"
    _expect_costs(tab)

    tab.page.select_option("#by", "model")
    tab.page.wait_for_function(
        "document.querySelector('#chart-requests rect.bar')?.dataset.series === " + repr(DEFAULT_MODEL)
    )
    assert {k: sum(v) for k, v in tab.drawn("requests", "rect.bar").items()} == {DEFAULT_MODEL: len(deployment.rows)}
    tab.page.select_option("#by", "key")
    tab.page.wait_for_function("document.querySelector('#chart-requests rect.bar')?.dataset.series === 'alpha'")
    tab.page.screenshot(path=tmp_path / "usage.png", full_page=True)

    assert all(url.startswith(deployment.server.base_url) or url.startswith("data:") for url in tab.urls)
    assert not tab.errors


def _expect_costs(tab: UsageTab) -> None:
    """Cost beside tokens: the tile, the cost chart, and the cost columns of the keys, models and days."""
    rows = tab.deployment.rows
    cost = {key: _cost(_rows_of(tab.deployment, key)) for key in TRAFFIC}
    assert cost["alpha"] > 0 and cost["beta"] > 0 and cost["tiny"] == 0  # a refusal is charged nothing
    assert tab.text("figure:has(#chart-cost) figcaption") == f"Cost ({CURRENCY})"
    drawn = {k: sum(v) for k, v in tab.drawn("cost", "rect.bar").items()}
    assert drawn == pytest.approx({k: float(c) for k, c in cost.items() if c})
    tile = tab.page.inner_text("[data-tile=Cost] .value").split()
    assert (Decimal(tile[0]), tile[1]) == (_cost(rows), CURRENCY)
    assert tab.page.inner_text("[data-tile=Cost] .detail") == "every request priced"
    for key, charged in cost.items():
        assert Decimal(tab.cell(key, "cost")) == charged, key
    assert tab.cell("plain", "cost") == "0.00"

    assert {m: Decimal(c) for m, c in tab.column("models", "cost").items()} == {DEFAULT_MODEL: _cost(rows)}
    assert tab.column("models", "tokens") == {DEFAULT_MODEL: str(_tokens(rows))}
    assert tab.column("models", "unpriced") == {DEFAULT_MODEL: "0"}
    days = {day: Decimal(c) for day, c in tab.column("days", "cost").items()}
    assert set(days) == {str(_started(r).date()) for r in rows} and sum(days.values()) == _cost(rows)
    assert sum(int(n) for n in tab.column("days", "requests").values()) == len(rows)


def test_a_keyless_server_on_loopback_opens_its_usage_reads_until_the_first_key(tmp_path: Path) -> None:
    """`tokenrelay serve` with no keys serves `/v1` open on loopback; the usage page's reads are open too, what
    changes who may use the server is not, and the first key closes both."""
    url = sqlite_url(tmp_path)
    server = start_server(tmp_path, "--database-url", url, env=FAST_CACHE)
    try:
        with server.http() as anonymous:
            assert anonymous.get("/admin/usage").status_code == 200
            assert anonymous.get("/admin/usage/series", params={"by": "model"}).status_code == 200
            assert anonymous.post("/admin/keys", json={"name": "sneaky"}).status_code == 401
            cli("keys", "create", "--name", "first", url=url)
            eventually(lambda: anonymous.get("/admin/usage").status_code == 401)
    finally:
        server.stop()
