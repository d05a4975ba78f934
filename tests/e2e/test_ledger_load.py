"""The ledger and the limits under concurrent load on one server, on SQLite and on PostgreSQL."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import openai
import pytest
from accounting_support import FAST_CACHE, counters, create_key, ledger_rows, postgres_database, sqlite_url
from servers import DEFAULT_MODEL, Server, start_server

# The full 200 on SQLite, the default store and the one with a single writer; PostgreSQL's concurrency is
# also exercised by two replicas in test_replicas.py, so a smaller load keeps the suite's time in bounds.
LOAD = {"sqlite": 200, "postgresql": 60}


@dataclass
class Setup:
    server: Server
    url: str
    keys: dict[str, str]
    load: int = 0


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def setup(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Setup]:
    tmp = tmp_path_factory.mktemp(f"load-{request.param}")
    with postgres_database() if request.param == "postgresql" else nullcontext(sqlite_url(tmp)) as url:
        yield from _serve(tmp, url, LOAD[request.param])


def _serve(tmp: Path, url: str, load: int) -> Iterator[Setup]:
    keys = {
        # Generous limits, so every request goes through reservation and settlement without being refused.
        "load": create_key(url, "load", "--rpm", "100000", "--tpm", "10000000", "--budget-tokens", "10000000"),
        "budget": create_key(url, "budget", "--budget-tokens", "100"),
    }
    # Many short sequences per decode step: the 200 requests need fewer steps (each costs about the same).
    server = start_server(
        tmp, "--database-url", url, "--queue-size", "256", "--slots", "32", "--ctx-size", "256", env=FAST_CACHE
    )
    try:
        yield Setup(server, url, keys, load)
    finally:
        server.stop()


def async_client(setup: Setup, key: str) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=f"{setup.server.base_url}/v1", api_key=key, max_retries=0, timeout=300)


async def one_request(client: openai.AsyncOpenAI, i: int) -> tuple[str, Any]:
    """Request `i`: chat or completions, streamed or not; returns its request id and reported usage."""
    request_id = f"load-{i:03d}"
    headers = {"X-Request-ID": request_id}
    common = {"model": DEFAULT_MODEL, "max_tokens": 1, "extra_headers": headers, "temperature": 0}
    stream = {"stream": True, "stream_options": {"include_usage": True}} if i % 2 else {}
    if i % 4 < 2:
        reply = await client.chat.completions.create(
            messages=[{"role": "user", "content": f"Count {i}"}], **common, **stream
        )
    else:
        reply = await client.completions.create(prompt=f"Number {i}:", **common, **stream)
    if not stream:
        return request_id, reply.usage
    usage = None
    async for chunk in reply:
        usage = chunk.usage or usage
    return request_id, usage


async def run_load(setup: Setup) -> dict[str, Any]:
    async with async_client(setup, setup.keys["load"]) as client:
        results = await asyncio.gather(*(one_request(client, i) for i in range(setup.load)))
    return dict(results)


def wait_for_rows(url: str, count: int, key_name: str, timeout: float = 30) -> list[dict[str, Any]]:
    import time

    deadline = time.monotonic() + timeout
    while True:
        rows = [r for r in ledger_rows(url) if r["key_name"] == key_name]
        if len(rows) >= count or time.monotonic() > deadline:
            return rows
        time.sleep(0.2)


def test_concurrent_requests_produce_one_exact_row_each(setup: Setup) -> None:
    usages = asyncio.run(run_load(setup))
    assert len(usages) == setup.load and all(u is not None for u in usages.values())
    rows = wait_for_rows(setup.url, setup.load, "load")
    assert len(rows) == setup.load
    by_id = {r["request_id"]: r for r in rows}
    assert set(by_id) == set(usages)
    for request_id, usage in usages.items():
        row = by_id[request_id]
        assert row["status"] == 200 and not row["usage_estimated"], row
        assert (row["prompt_tokens"], row["completion_tokens"]) == (usage.prompt_tokens, usage.completion_tokens)
        assert row["streamed"] == (int(request_id[-3:]) % 2 == 1)
    state = counters(setup.url, "load")
    assert state["budget_used"] == sum(u.prompt_tokens + u.completion_tokens for u in usages.values())
    assert state["budget_reserved"] == 0


async def budget_round(setup: Setup, size: int) -> list[int | str]:
    """`size` concurrent requests: each one's total tokens, or its error code."""

    async def one(client: openai.AsyncOpenAI) -> int | str:
        try:
            reply = await client.completions.create(model=DEFAULT_MODEL, prompt="Hi", max_tokens=4)
        except openai.RateLimitError as exc:
            return str(exc.code)
        return reply.usage.total_tokens

    async with async_client(setup, setup.keys["budget"]) as client:
        return list(await asyncio.gather(*(one(client) for _ in range(size))))


def drain_budget(setup: Setup) -> list[int | str]:
    outcomes: list[int | str] = []
    for _ in range(10):
        this_round = asyncio.run(budget_round(setup, 25))
        outcomes += this_round
        # Reservations are settled with the ledger rows, a moment after the responses: wait for them so the
        # next round sees what is really left.
        wait_for_rows(setup.url, len(outcomes), "budget")
        if all(isinstance(o, str) for o in this_round):
            return outcomes  # nothing was in flight and still nothing fitted: the budget is spent
    raise AssertionError(f"a 100-token budget was not exhausted by {len(outcomes)} requests")


def test_budget_under_concurrent_load_stops_at_the_limit(setup: Setup) -> None:
    outcomes = drain_budget(setup)
    served = [o for o in outcomes if isinstance(o, int)]
    refused = [o for o in outcomes if isinstance(o, str)]
    assert served and refused and set(refused) == {"insufficient_quota"}
    wait_for_rows(setup.url, len(outcomes), "budget")
    state = counters(setup.url, "budget")
    assert state["budget_reserved"] == 0
    assert state["budget_used"] == sum(served) <= 100
    # "Hi" reserves 4 prompt + 4 completion tokens; the last full round could not fit even that.
    assert state["budget_used"] > 100 - 8
