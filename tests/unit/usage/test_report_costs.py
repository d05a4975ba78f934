"""Costs in `usage_report` and `usage_series`, over ledger rows of known cost on SQLite and PostgreSQL."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from contextlib import nullcontext
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from accounting_support import postgres_database, sqlite_url
from sqlalchemy import insert

from tokenrelay.config import Settings
from tokenrelay.store.database import create_engine, database_url
from tokenrelay.store.migrate import upgrade
from tokenrelay.store.schema import usage
from tokenrelay.usage.report import UsageQuery, usage_report
from tokenrelay.usage.series import SeriesQuery, usage_series
from tokenrelay.usage.window import window

DAY_1 = datetime(2026, 3, 9, 10, 15)
DAY_2 = datetime(2026, 3, 10, 8, 5)
# Beyond 2^53 together: a sum through a float would lose the last micro-unit.
HUGE = 2**52 + 1


def _row(model: str, key: str, started: datetime, cost: int, priced: bool = True, status: int = 200) -> dict:
    return {
        "id": uuid.uuid4().hex,
        "request_id": uuid.uuid4().hex,
        "key_id": f"id-{key}",
        "key_name": key,
        "endpoint": "chat.completions",
        "model": model,
        "backend": "upstream",
        "streamed": False,
        "status": status,
        "error": None,
        "cancelled": False,
        "finish_reasons": "stop",
        "prompt_tokens": 10,
        "completion_tokens": 5,
        "cached_tokens": 2,
        "usage_estimated": False,
        "ttft_ms": 3.0,
        "latency_ms": 9.0,
        "user": None,
        "started_at": started,
        "ended_at": started + timedelta(seconds=1),
        "batch_id": None,
        "cost": cost,
        "priced": priced,
        "served_model": None,
    }


# The same model at two prices (a price change between the days): each row keeps what it was charged.
ROWS = [
    _row("paid", "alpha", DAY_1, 1_234_567),
    _row("paid", "alpha", DAY_2, 2_000_001),
    _row("paid", "beta", DAY_2, 7),
    _row("local", "beta", DAY_1, 0, priced=False),
    _row("local", "alpha", DAY_2, 0, priced=False, status=500),
    _row("huge", "gamma", DAY_2, HUGE),
    _row("huge", "gamma", DAY_2, HUGE),
]


@pytest.fixture(params=["sqlite", "postgresql"])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    with postgres_database() if request.param == "postgresql" else nullcontext(sqlite_url(tmp_path)) as value:
        asyncio.run(_fill(value))
        yield value


async def _fill(url: str) -> None:
    engine = create_engine(database_url(Settings(database_url=url)))
    try:
        await upgrade(engine)
        async with engine.begin() as conn:
            await conn.execute(insert(usage), ROWS)
    finally:
        await engine.dispose()


async def _ask(url: str, ask: Any) -> dict[str, Any]:
    engine = create_engine(database_url(Settings(database_url=url)))
    try:
        return await ask(engine)
    finally:
        await engine.dispose()


def report(url: str, currency: str = "USD", **query: Any) -> dict[str, Any]:
    return asyncio.run(_ask(url, lambda engine: usage_report(engine, UsageQuery(**query), currency)))


def series(url: str, query: SeriesQuery) -> dict[str, Any]:
    return asyncio.run(_ask(url, lambda engine: usage_series(engine, query, "EUR")))


def test_report_totals_and_model_groups_carry_exact_costs(url: str) -> None:
    found = report(url, by="model")
    assert found["currency"] == "USD"
    totals = found["totals"]
    assert totals["cost_micros"] == 1_234_567 + 2_000_001 + 7 + 2 * HUGE
    assert totals["cost"] == "9007199257.975569"  # 2^53 + 2 + 3_234_575 micro-units, to the last one
    assert totals["unpriced_requests"] == 2 and totals["requests"] == len(ROWS)
    groups = {g["model"]: g for g in found["groups"]}
    assert list(groups) == ["huge", "local", "paid"]
    paid, local = groups["paid"], groups["local"]
    assert (paid["cost"], paid["cost_micros"], paid["unpriced_requests"]) == ("3.234575", 3_234_575, 0)
    assert (local["cost"], local["cost_micros"], local["unpriced_requests"]) == ("0.000000", 0, 2)
    assert groups["huge"]["cost_micros"] == 2 * HUGE
    assert sum(g["cost_micros"] for g in groups.values()) == totals["cost_micros"]


def test_report_by_key_and_day_and_filtered(url: str) -> None:
    by_key = {g["key_name"]: g for g in report(url, by="key", model="paid")["groups"]}
    assert {name: g["cost"] for name, g in by_key.items()} == {"alpha": "3.234568", "beta": "0.000007"}
    by_day = {g["day"]: g for g in report(url, "EUR", by="day", key="alpha")["groups"]}
    assert {day: (g["cost_micros"], g["unpriced_requests"]) for day, g in by_day.items()} == {
        "2026-03-09": (1_234_567, 0),
        "2026-03-10": (2_000_001, 1),
    }
    since = report(url, "EUR", since=DAY_2, key="beta")
    assert since["currency"] == "EUR"
    assert (since["totals"]["cost"], since["totals"]["requests"]) == ("0.000007", 1)
    nothing = report(url, model="absent")["totals"]
    assert (nothing["cost"], nothing["cost_micros"], nothing["unpriced_requests"]) == ("0.000000", 0, 0)


def test_series_carry_cost_per_bucket_beside_tokens(url: str) -> None:
    days = window("day", DAY_1, DAY_2, DAY_2)
    found = series(url, SeriesQuery(window=days, by="model"))
    assert found["currency"] == "EUR"
    total = found["total"]
    assert total["cost_micros"] == [1_234_567, 2_000_001 + 7 + 2 * HUGE]
    assert total["cost"] == ["1.234567", "9007199256.741002"]
    assert total["unpriced_requests"] == [1, 1]
    assert total["summary"]["cost_micros"] == 1_234_567 + 2_000_001 + 7 + 2 * HUGE
    assert total["summary"]["cost"] == "9007199257.975569"
    assert total["summary"]["unpriced_requests"] == 2
    models = {entry["model"]: entry for entry in found["series"]}
    assert models["paid"]["cost"] == ["1.234567", "2.000008"]
    assert models["paid"]["prompt_tokens"] == [10, 20]  # cost beside the tokens of the same bucket
    assert models["local"]["cost_micros"] == [0, 0] and models["local"]["unpriced_requests"] == [1, 1]


def test_series_summed_into_other_keep_their_cost(url: str) -> None:
    days = window("day", DAY_1, DAY_2, DAY_2)
    first, other = series(url, SeriesQuery(window=days, by="key", limit=1))["series"]
    assert first["key_name"] == "alpha"  # most tokens
    assert other["other"] == 2
    assert other["summary"]["cost_micros"] == 7 + 2 * HUGE
    assert other["summary"]["unpriced_requests"] == 1
