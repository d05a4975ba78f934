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
from replica_support import Replicas, completion_round
from servers import DEFAULT_MODEL, SHARED_CORES, Server, start_server, wait_ready

INPUT, OUTPUT = Decimal(100), Decimal(200)  # per million tokens: micro-units per token
BUDGET = 10_000  # micro-units: 0.01
MONTH_END = datetime(2027, 1, 31, 23, 0)
NEXT_MONTH = datetime(2027, 2, 1)


@dataclass
class ClockedReplicas(Replicas):
    clock: MovableClock


@pytest.fixture(scope="module")
def replicas(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ClockedReplicas]:
    tmp = tmp_path_factory.mktemp("money-replicas")
    clock = MovableClock(tmp)
    clock.set(MONTH_END)
    config = tmp / "tokenrelay.yaml"
    pricing = {"input": str(INPUT), "output": str(OUTPUT)}
    config.write_text(yaml.safe_dump({"models": [{"id": DEFAULT_MODEL, "chat": False, "pricing": pricing}]}))
    with postgres_database() as url:
        admin = create_key(url, "ops", "--admin")
        args = ("--config", str(config), "--database-url", url)
        env = {**FAST_CACHE, **clock.env(), **SHARED_CORES}
        a = start_server(tmp, *args, env=env, wait=False)
        b = start_server(tmp, *args, env=env)
        try:
            wait_ready(a)
            yield ClockedReplicas(a, b, url, admin, clock)
        finally:
            a.stop()
            b.stop()


def _cost(reply: openai.types.Completion) -> int:
    """What the answer costs at the model's prices, in micro-units."""
    return int(reply.usage.prompt_tokens * INPUT + reply.usage.completion_tokens * OUTPUT)


def _shown(replicas: Replicas, server: Server) -> dict[str, Any]:
    """The wallet key as `server`'s admin API shows it."""
    with server.http(headers={"Authorization": f"Bearer {replicas.admin}"}) as http:
        return http.get("/admin/keys/wallet").json()


def _rows(url: str) -> list[dict[str, Any]]:
    return [row for row in ledger_rows(url) if row["key_name"] == "wallet"]


def _spend_until_refused(replicas: ClockedReplicas, key: str) -> list[int]:
    """Rounds of concurrent requests until a whole round is refused; the costs of those served."""
    outcomes: list[int | str] = []
    already = len(_rows(replicas.url))
    for _ in range(12):
        this_round = asyncio.run(completion_round([replicas.a, replicas.b], key, 8, _cost))
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
    replicas: ClockedReplicas,
) -> None:
    key = replicas.create(replicas.a, name="wallet", budget_cost="0.01", budget_period="monthly")
    assert _shown(replicas, replicas.b)["resets_at"] == "2027-02-01T00:00:00Z"

    january = _spend_until_refused(replicas, key)
    state = counters(replicas.url, "wallet")
    assert state["cost_reserved"] == 0
    assert state["cost_used"] == sum(january) <= BUDGET
    assert state["cost_used"] > BUDGET - 1_200  # "Hi" with max_tokens 4 may cost up to 1,200: not even that was left
    rows = _rows(replicas.url)
    assert sum(row["cost"] for row in rows) == sum(january)
    assert all(row["cost"] == row["prompt_tokens"] * INPUT + row["completion_tokens"] * OUTPUT for row in rows)

    replicas.clock.set(NEXT_MONTH + timedelta(minutes=1))
    for server in (replicas.a, replicas.b):  # each replica reads the moved clock within a second or two
        wait_for(lambda: _shown(replicas, server)["resets_at"] == "2027-03-01T00:00:00Z", "February")  # noqa: B023
        assert _shown(replicas, server)["cost_used"] == "0.000000"
    february = _spend_until_refused(replicas, key)
    state = counters(replicas.url, "wallet")
    assert state["period_start"] == NEXT_MONTH and state["cost_reserved"] == 0
    assert state["cost_used"] == sum(february) <= BUDGET and len(february) >= 5
    new_rows = [row for row in _rows(replicas.url) if row["started_at"] >= NEXT_MONTH]
    assert sum(row["cost"] for row in new_rows) == sum(february)
