"""Admission against a key's limits on a real SQLite database: the buckets, the budget, its settlement and the
sweep of reservations a dead replica left."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import TypeVar

import pytest
from sqlalchemy import update
from sqlalchemy.engine import make_url

from tokenrelay.auth.keysecrets import hash_secret
from tokenrelay.auth.keystore import KeySpec, KeyStore
from tokenrelay.auth.principal import Principal
from tokenrelay.errors import QuotaExceeded, RateLimited
from tokenrelay.limits.cost import Charge
from tokenrelay.limits.limiter import BudgetState, Limiter
from tokenrelay.limits.settle import Spent, settle
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


async def principal(store: KeyStore, **limits: int) -> Principal:
    _, secret = await store.create(KeySpec(name="k", **limits))
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
