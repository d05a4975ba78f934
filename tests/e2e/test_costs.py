"""What each call costs, in the ledger of a real server: the prices times the row's own token counts, for JSON
answers, streams, cut streams, cached prompt tokens and n > 1; an unpriced model costs 0 and says so."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from decimal import ROUND_HALF_UP, Decimal
from typing import Any

import openai
import pytest
import yaml
from accounting_support import create_key, ledger_rows, sqlite_url
from gateway_support import wait_for
from servers import DEFAULT_MODEL, Server, start_server

CHAT = "smollm2-135m-instruct"
PRICES = {"input": Decimal("1.25"), "cached_input": Decimal("0.3"), "output": Decimal("2.5")}  # per million tokens


@dataclass
class Priced:
    server: Server
    url: str
    key: str

    def client(self) -> openai.OpenAI:
        return self.server.client(api_key=self.key)


@pytest.fixture(scope="module")
def priced(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Priced]:
    tmp = tmp_path_factory.mktemp("costs")
    config = tmp / "tokenrelay.yaml"
    pricing = {name: str(price) for name, price in PRICES.items()}
    models = [{"id": CHAT, "pricing": pricing}, {"id": DEFAULT_MODEL, "chat": False}]
    config.write_text(yaml.safe_dump({"currency": "EUR", "models": models}))
    url = sqlite_url(tmp)
    key = create_key(url, "payer", "--budget-cost", "5", "--budget-period", "monthly")
    server = start_server(tmp, "--config", str(config), "--database-url", url)
    try:
        yield Priced(server, url, key)
    finally:
        server.stop()


def expected_cost(row: dict[str, Any]) -> int:
    """Micro-units: a price per million tokens is what one token costs in millionths."""
    cached = row["cached_tokens"]
    exact = (
        (row["prompt_tokens"] - cached) * PRICES["input"]
        + cached * PRICES["cached_input"]
        + row["completion_tokens"] * PRICES["output"]
    )
    return int(exact.to_integral_value(ROUND_HALF_UP))


def rows_for(url: str, count: int) -> list[dict[str, Any]]:
    wait_for(lambda: len(ledger_rows(url)) >= count, f"{count} ledger rows")
    return ledger_rows(url)


def chat(**extra: Any) -> dict[str, Any]:
    return {"model": CHAT, "messages": [{"role": "user", "content": "Name a colour."}], "max_tokens": 4, **extra}


def test_every_row_costs_its_prices_times_its_own_counts(priced: Priced) -> None:
    client = priced.client()
    long_prompt = "Here is a long shared preamble about colours and shapes. " * 6
    client.chat.completions.create(**chat())
    stream = client.chat.completions.create(**chat(stream=True, stream_options={"include_usage": True}))
    streamed_usage = [c.usage for c in stream if c.usage is not None]
    many = client.chat.completions.create(**chat(n=3, temperature=0.9, seed=4))
    cached = [
        client.chat.completions.create(**chat(messages=[{"role": "user", "content": long_prompt + ask}], temperature=0))
        for ask in ("Pick one.", "Pick two.")
    ]
    # A long answer, so the generation is still running when the client goes (a short one may end first).
    story = [{"role": "user", "content": "Write a long story about a dragon and a knight."}]
    long_answer = chat(messages=story, stream=True, max_tokens=256, temperature=0)
    with client.chat.completions.with_streaming_response.create(**long_answer) as cut:
        next(cut.iter_lines())  # the first chunk, then the client goes
    client.completions.create(model=DEFAULT_MODEL, prompt="Once upon", max_tokens=3)  # unpriced

    rows = rows_for(priced.url, 7)
    by_id = {row["request_id"]: row for row in rows}
    assert len(by_id) == 7
    chat_rows = [row for row in rows if row["model"] == CHAT]
    for row in chat_rows:
        assert row["priced"] and row["cost"] == expected_cost(row) > 0, row
    assert streamed_usage and any(
        r["completion_tokens"] == streamed_usage[0].completion_tokens and r["streamed"] for r in chat_rows
    )
    assert any(r["completion_tokens"] == many.usage.completion_tokens > 4 for r in chat_rows)  # n = 3 choices
    assert cached[1].usage.prompt_tokens_details.cached_tokens > 0  # the shared preamble came from the cache
    cached_row = next(r for r in chat_rows if r["cached_tokens"] > 0)
    assert cached_row["cost"] < expected_cost({**cached_row, "cached_tokens": 0})  # cheaper than new tokens
    cut_row = next(r for r in chat_rows if r["cancelled"])
    assert 1 <= cut_row["completion_tokens"] < 256 and cut_row["cost"] == expected_cost(cut_row)
    unpriced = next(row for row in rows if row["model"] == DEFAULT_MODEL)
    assert (unpriced["priced"], unpriced["cost"]) == (False, 0) and unpriced["completion_tokens"] == 3


def test_a_chat_prompt_on_the_engine_reserves_its_exact_tokens(priced: Priced) -> None:
    """A key allowed 60 tokens a minute sends a chat whose prompt is far under its JSON-based bound: the engine
    counts the prompt itself, so the request fits; a second one, over the minute's tokens, does not."""
    key = create_key(priced.url, "tight", "--tpm", "60")
    client = priced.server.client(api_key=key)
    first = client.chat.completions.create(**chat(messages=[{"role": "user", "content": "Hi."}], max_tokens=2))
    assert first.usage is not None and first.usage.total_tokens <= 60
    with pytest.raises(openai.RateLimitError):
        client.chat.completions.create(**chat(messages=[{"role": "user", "content": "Hi."}], max_tokens=30))
