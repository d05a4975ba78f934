"""Two server processes on one PostgreSQL racing one key's monthly money budget, across a month's end: each
period's spend stays within the budget, every cent of it is in the ledger, and the new month admits again.

The servers' wall clock is moved by the test (`movable_clock.py`), so the month ends when the test says."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any

import openai
import pytest
import yaml
from accounting_support import FAST_CACHE, counters, create_key, ledger_rows, postgres_database
from gateway_support import wait_for
from movable_clock import MovableClock
from servers import DEFAULT_MODEL, Server, start_server, wait_ready

INPUT, OUTPUT = Decimal(100), Decimal(200)  # per million tokens: micro-units per token
BUDGET = 10_000  # micro-units: 0.01
MONTH_END = datetime(2027, 1, 31, 23, 0)
NEXT_MONTH = datetime(2027, 2, 1)


@dataclass
class Replicas:
    a: Server
    b: Server
    url: str
    admin: str
    clock: MovableClock


@pytest.fixture(scope="module")
def replicas(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Replicas]:
    tmp = tmp_path_factory.mktemp("money-replicas")
    clock = MovableClock(tmp)
    clock.set(MONTH_END)
    config = tmp / "tokenrelay.yaml"
    pricing = {"input": str(INPUT), "output": str(OUTPUT)}
    config.write_text(yaml.safe_dump({"models": [{"id": DEFAULT_MODEL, "chat": False, "pricing": pricing}]}))
    with postgres_database() as url:
        admin = create_key(url, "ops", "--admin")
        args = ("--config", str(config), "--database-url", url)
        env = {**FAST_CACHE, **clock.env()}
        a = start_server(tmp, *args, env=env, wait=False)
        b = start_server(tmp, *args, env=env)
        try:
            wait_ready(a)
            yield Replicas(a, b, url, admin, clock)
        finally:
            a.stop()
            b.stop()


async def _round(servers: list[Server], key: str, size: int) -> list[int | str]:
    """`size` requests at once, alternating between the replicas: each one's cost in micro-units, or the error."""
    clients = [
        openai.AsyncOpenAI(base_url=f"{s.base_url}/v1", api_key=key, max_retries=0, timeout=300) for s in servers
    ]

    async def one(i: int) -> int | str:
        try:
            reply = await clients[i % 2].completions.create(model=DEFAULT_MODEL, prompt="Hi", max_tokens=4)
        except openai.RateLimitError as exc:
            return str(exc.code)
        return int(reply.usage.prompt_tokens * INPUT + reply.usage.completion_tokens * OUTPUT)

    try:
        return list(await asyncio.gather(*(one(i) for i in range(size))))
    finally:
        for client in clients:
            await client.close()


def _rows(url: str) -> list[dict[str, Any]]:
    return [row for row in ledger_rows(url) if row["key_name"] == "wallet"]


def _spend_until_refused(replicas: Replicas, key: str) -> list[int]:
    """Rounds of concurrent requests until a whole round is refused; the costs of those served."""
    outcomes: list[int | str] = []
    already = len(_rows(replicas.url))
    for _ in range(12):
        this_round = asyncio.run(_round([replicas.a, replicas.b], key, 8))
        outcomes += this_round
        expected = already + len(outcomes)
        wait_for(lambda: len(_rows(replicas.url)) >= expected, "the round's ledger rows")  # noqa: B023
        if all(isinstance(o, str) for o in this_round):
            break
    else:
        pytest.fail("the money budget was not exhausted")
    assert {o for o in outcomes if isinstance(o, str)} == {"insufficient_quota"}
    return [o for o in outcomes if isinstance(o, int)]


def test_two_replicas_never_overspend_a_monthly_money_budget_and_the_next_month_starts_afresh(
    replicas: Replicas,
) -> None:
    with replicas.a.http(headers={"Authorization": f"Bearer {replicas.admin}"}) as http:
        spec = {"name": "wallet", "budget_cost": "0.01", "budget_period": "monthly"}
        created = http.post("/admin/keys", json=spec)
        assert created.status_code == 201, created.text
        key = created.json()["key"]
        assert created.json()["resets_at"] == "2027-02-01T00:00:00Z"

    january = _spend_until_refused(replicas, key)
    state = counters(replicas.url, "wallet")
    assert state["cost_reserved"] == 0
    assert state["cost_used"] == sum(january) <= BUDGET
    assert state["cost_used"] > BUDGET - 1_200  # "Hi" with max_tokens 4 may cost up to 1,200: not even that was left
    rows = _rows(replicas.url)
    assert sum(row["cost"] for row in rows) == sum(january)
    assert all(row["cost"] == row["prompt_tokens"] * INPUT + row["completion_tokens"] * OUTPUT for row in rows)

    replicas.clock.set(NEXT_MONTH + timedelta(minutes=1))
    with replicas.b.http(headers={"Authorization": f"Bearer {replicas.admin}"}) as http:
        shown = http.get("/admin/keys/wallet").json()
    assert (shown["cost_used"], shown["resets_at"]) == ("0.000000", "2027-03-01T00:00:00Z")
    february = _spend_until_refused(replicas, key)
    state = counters(replicas.url, "wallet")
    assert state["period_start"] == NEXT_MONTH and state["cost_reserved"] == 0
    assert state["cost_used"] == sum(february) <= BUDGET and len(february) >= 5
    new_rows = [row for row in _rows(replicas.url) if row["started_at"] >= NEXT_MONTH]
    assert sum(row["cost"] for row in new_rows) == sum(february)
