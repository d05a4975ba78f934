"""Admission against a key's limits on a real SQLite database: the buckets, the budget, its settlement and the
sweep of reservations a dead replica left."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import datetime
from pathlib import Path
from typing import TypeVar

import pytest
from sqlalchemy import update
from sqlalchemy.engine import make_url

from tokenrelay.auth.keysecrets import hash_secret
from tokenrelay.auth.keystore import KeySpec, KeyStore
from tokenrelay.errors import QuotaExceeded, RateLimited
from tokenrelay.limits.cost import Charge
from tokenrelay.limits.limiter import BudgetState, Limiter
from tokenrelay.limits.settle import Spent, settle
from tokenrelay.principal import Principal
from tokenrelay.store.database import create_engine
from tokenrelay.store.migrate import upgrade
from tokenrelay.store.schema import reservations
from tokenrelay.store.timeutil import utcnow

T = TypeVar("T")


def run(scenario: Callable[[Path], Awaitable[T]], tmp_path: Path) -> T:
    return asyncio.run(scenario(tmp_path))


async def opened(tmp_path: Path) -> AsyncIterator[tuple[KeyStore, Limiter]]:
    engine = create_engine(make_url(f"sqlite+aiosqlite:///{tmp_path / 'limits.db'}"))
    await upgrade(engine)
    try:
        yield KeyStore(engine), Limiter(engine)
    finally:
        await engine.dispose()


async def principal(store: KeyStore, **limits: int | str) -> Principal:
    _, secret = await store.create(KeySpec(name="k", **limits))  # type: ignore[arg-type]
    found = await store.principal(hash_secret(secret))
    assert found is not None
    return found


def test_requests_per_minute_allow_a_burst_then_refuse_with_retry_after(tmp_path: Path) -> None:
    async def scenario(path: Path) -> None:
        async for store, limiter in opened(path):
            caller = await principal(store, rpm=3)
            for _ in range(3):
                assert await limiter.admit(caller, Charge(10)) is not None
            with pytest.raises(RateLimited) as refused:
                await limiter.admit(caller, Charge(10))
            assert "3 requests per minute" in refused.value.message
            assert 1 <= int(refused.value.headers["Retry-After"]) <= 20  # a third of a minute drains one request

    run(scenario, tmp_path)


def test_a_request_larger_than_the_token_limit_is_refused_at_once(tmp_path: Path) -> None:
    async def scenario(path: Path) -> None:
        async for store, limiter in opened(path):
            caller = await principal(store, tpm=100)
            with pytest.raises(RateLimited, match="more than the key's limit of 100 tokens per minute"):
                await limiter.admit(caller, Charge(101))
            assert await limiter.admit(caller, Charge(100)) is not None
            with pytest.raises(RateLimited, match="100 tokens per minute"):
                await limiter.admit(caller, Charge(1))

    run(scenario, tmp_path)


def test_the_budget_holds_reservations_and_settles_to_real_usage(tmp_path: Path) -> None:
    async def scenario(path: Path) -> None:
        async for store, limiter in opened(path):
            caller = await principal(store, budget_tokens=100)
            first = await limiter.admit(caller, Charge(60))
            assert await limiter.budget_state(caller.key_id) == BudgetState(0, 60)
            with pytest.raises(QuotaExceeded, match="40 remain of 100"):
                await limiter.admit(caller, Charge(50))  # 60 held + 50 would pass 100
            async with limiter.engine.begin() as conn:
                await settle(conn, [(first, Spent(15))])
            assert await limiter.budget_state(caller.key_id) == BudgetState(15, 0)
            assert await limiter.admit(caller, Charge(85)) is not None

    run(scenario, tmp_path)


def test_reservations_of_a_dead_replica_are_given_back(tmp_path: Path) -> None:
    async def scenario(path: Path) -> None:
        async for store, limiter in opened(path):
            caller = await principal(store, budget_tokens=100)
            await limiter.admit(caller, Charge(70))
            assert await limiter.release_stale(older_than=3600) == 0  # young: kept
            async with limiter.engine.begin() as conn:
                await conn.execute(update(reservations).values(created_at=utcnow().replace(year=2000)))
            assert await limiter.release_stale(older_than=3600) == 1
            assert await limiter.budget_state(caller.key_id) == BudgetState(0, 0)

    run(scenario, tmp_path)


def test_an_unlimited_key_never_touches_the_counters(tmp_path: Path) -> None:
    async def scenario(path: Path) -> None:
        async for store, limiter in opened(path):
            caller = await principal(store)
            assert await limiter.admit(caller, Charge(10**9)) is None

    run(scenario, tmp_path)


class Clock:
    """A clock the test moves: what the limiter and the key store take as now (naive UTC)."""

    def __init__(self, now: datetime) -> None:
        self.now = now

    def __call__(self) -> datetime:
        return self.now


async def clocked(tmp_path: Path, clock: Clock) -> AsyncIterator[tuple[KeyStore, Limiter]]:
    async for store, limiter in opened(tmp_path):
        yield KeyStore(store.engine, clock), Limiter(limiter.engine, clock)


def test_a_money_budget_holds_the_worst_case_and_settles_to_the_exact_cost(tmp_path: Path) -> None:
    async def scenario(path: Path) -> None:
        async for store, limiter in opened(path):
            caller = await principal(store, budget_cost=1_000_000)  # 1.000000 in micro-units
            first = await limiter.admit(caller, Charge(100, 700_000), "EUR")
            with pytest.raises(
                QuotaExceeded, match=r"budget of 1\.000000 EUR .* cost up to 0\.400000 EUR and 0\.300000"
            ):
                await limiter.admit(caller, Charge(100, 400_000), "EUR")
            async with limiter.engine.begin() as conn:
                await settle(conn, [(first, Spent(40, 123_457))])
            assert await limiter.budget_state(caller.key_id) == BudgetState(40, 0, 123_457, 0)
            assert await limiter.admit(caller, Charge(100, 876_543), "EUR") is not None  # exactly what is left
            with pytest.raises(QuotaExceeded):
                await limiter.admit(caller, Charge(1, 1), "EUR")

    run(scenario, tmp_path)


@pytest.mark.parametrize(
    ("period", "start", "after"),
    [
        ("monthly", datetime(2027, 1, 31, 23, 59), datetime(2027, 2, 1, 0, 0, 1)),
        ("weekly", datetime(2027, 1, 3, 12, 0), datetime(2027, 1, 4, 0, 0)),  # Sunday, then Monday
        ("daily", datetime(2027, 1, 3, 23, 0), datetime(2027, 1, 4, 0, 30)),
    ],
)
def test_a_periodic_budget_starts_from_zero_at_the_period_boundary(
    tmp_path: Path, period: str, start: datetime, after: datetime
) -> None:
    async def scenario(path: Path) -> None:
        clock = Clock(start)
        async for store, limiter in clocked(path, clock):
            caller = await principal(store, budget_tokens=100, budget_cost=500, budget_period=period)
            spent = await limiter.admit(caller, Charge(80, 100))
            async with limiter.engine.begin() as conn:
                await settle(conn, [(spent, Spent(80, 100))])
            with pytest.raises(QuotaExceeded, match=f"{period} token budget .* It resets at {after:%Y-%m-%d}T00"):
                await limiter.admit(caller, Charge(30, 1))
            assert (await store.get("k")).budget_used == 80
            clock.now = after
            record = await store.get("k")
            assert (record.budget_used, record.cost_used) == (0, 0)  # shown for the new period before any request
            assert record.resets_at is not None and record.resets_at > after
            assert await limiter.admit(caller, Charge(100, 500)) is not None  # the whole budget again
            with pytest.raises(QuotaExceeded):
                await limiter.admit(caller, Charge(1, 0))

    run(scenario, tmp_path)


def test_a_total_budget_never_resets(tmp_path: Path) -> None:
    async def scenario(path: Path) -> None:
        clock = Clock(datetime(2027, 1, 31, 23, 59))
        async for store, limiter in clocked(path, clock):
            caller = await principal(store, budget_tokens=100)
            spent = await limiter.admit(caller, Charge(90))
            async with limiter.engine.begin() as conn:
                await settle(conn, [(spent, Spent(90))])
            clock.now = datetime(2028, 6, 1)
            with pytest.raises(QuotaExceeded, match="10 remain of 100"):
                await limiter.admit(caller, Charge(20))
            assert (await store.get("k")).resets_at is None

    run(scenario, tmp_path)
