"""Rate buckets in the real Redis at 127.0.0.1:6379 (a key prefix of each test's own, deleted afterwards), the
limiter taking them there and the budgets from SQLite, and the limiter counting locally when Redis is not there
(a closed port: that test needs no Redis)."""

from __future__ import annotations

import asyncio
import logging
import socket
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest
from sqlalchemy import select
from sqlalchemy.engine import make_url

from tokenrelay.auth.keysecrets import hash_secret
from tokenrelay.auth.keystore import KeySpec, KeyStore
from tokenrelay.errors import QuotaExceeded, RateLimited
from tokenrelay.limits.cost import Charge
from tokenrelay.limits.limiter import Limiter
from tokenrelay.limits.local_rates import LocalRates
from tokenrelay.limits.rates import FailoverRates, RateAsk
from tokenrelay.limits.shared_rates import SharedRates
from tokenrelay.principal import Principal
from tokenrelay.store.database import create_engine
from tokenrelay.store.migrate import upgrade
from tokenrelay.store.schema import key_counters

REDIS_URL = "redis://127.0.0.1:6379/0"


@asynccontextmanager
async def shared_rates(url: str = REDIS_URL) -> AsyncIterator[SharedRates]:
    rates = SharedRates(url, prefix=f"tokenrelay-test:{uuid.uuid4().hex}:")
    try:
        yield rates
    finally:
        if url == REDIS_URL:
            keys = [key async for key in rates.client.scan_iter(match=rates.prefix + "*")]
            if keys:
                await rates.client.delete(*keys)
        await rates.close()


@dataclass
class Gateway:
    store: KeyStore
    limiter: Limiter
    rates: FailoverRates
    shared: SharedRates


@asynccontextmanager
async def gateway(tmp_path: Path, url: str = REDIS_URL) -> AsyncIterator[Gateway]:
    """A limiter with its buckets behind `url` and its budgets in a fresh SQLite file."""
    engine = create_engine(make_url(f"sqlite+aiosqlite:///{tmp_path / 'limits.db'}"))
    await upgrade(engine)
    async with shared_rates(url) as shared:
        rates = FailoverRates(shared, LocalRates(), url)
        try:
            yield Gateway(KeyStore(engine), Limiter(engine, rates=rates), rates, shared)
        finally:
            await engine.dispose()


async def principal(store: KeyStore, **limits: int) -> Principal:
    _, secret = await store.create(KeySpec(name="k", **limits))  # type: ignore[arg-type]
    found = await store.principal(hash_secret(secret))
    assert found is not None
    return found


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]  # nothing listens once the socket is closed


def test_redis_buckets_admit_a_burst_and_refuse_atomically_under_concurrency() -> None:
    async def scenario() -> None:
        async with shared_rates() as rates:
            ask = RateAsk("k", rpm=60, tpm=None, tokens=0)
            outcomes = await asyncio.gather(*(rates.take(ask) for _ in range(100)))
            assert sum(o is None for o in outcomes) == 60
            refused = [o for o in outcomes if o is not None]
            assert all(59 <= o.rpm_level <= 60 for o in refused)
            assert 0 < await rates.client.ttl(rates.prefix + "k") <= 61  # forgotten after a minute idle

    asyncio.run(scenario())


def test_redis_tokens_per_minute_take_tokens_and_give_backs() -> None:
    async def scenario() -> None:
        async with shared_rates() as rates:
            ask = RateAsk("k", rpm=10, tpm=100, tokens=60)
            assert await rates.take(ask) is None
            refused = await rates.take(ask)
            assert refused is not None
            assert refused.tpm_level == pytest.approx(60, abs=0.1)
            assert refused.rpm_level == pytest.approx(1, abs=0.01)  # a refused take fills neither bucket
            await rates.give_back("k", 0, 50)  # the first request used 10 of its 60
            assert await rates.take(ask) is None
            await rates.give_back("k", 5, 500)  # never below empty
            state = await rates.client.hgetall(rates.prefix + "k")
            assert float(state[b"rpm"]) == 0 and float(state[b"tpm"]) == 0

    asyncio.run(scenario())


def test_the_limiter_refuses_from_redis_with_the_usual_429_and_skips_the_database(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with gateway(tmp_path) as gw:
            caller = await principal(gw.store, rpm=3, tpm=1000)
            for _ in range(3):
                reservation = await gw.limiter.admit(caller, Charge(10))
                assert reservation is not None and reservation.rate_tokens == 10 and not reservation.tpm
            with pytest.raises(RateLimited) as refused:
                await gw.limiter.admit(caller, Charge(10))
            assert refused.value.message.startswith("Rate limit reached: 3 requests per minute. Retry after")
            assert 1 <= int(refused.value.headers["Retry-After"]) <= 20
            async with gw.limiter.engine.connect() as conn:
                row = (await conn.execute(select(key_counters))).one()
            assert row.rpm_level == 0 and row.tpm_level == 0  # the buckets live in Redis only

    asyncio.run(scenario())


def test_a_budget_refusal_gives_the_redis_take_back(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with gateway(tmp_path) as gw:
            caller = await principal(gw.store, rpm=2, budget_tokens=15)
            assert await gw.limiter.admit(caller, Charge(10)) is not None
            with pytest.raises(QuotaExceeded):
                await gw.limiter.admit(caller, Charge(10))
            state = await gw.shared.client.hgetall(gw.shared.prefix + caller.key_id)  # type: ignore[operator]
            assert float(state[b"rpm"]) == pytest.approx(1, abs=0.01)  # the refused request holds no rpm
            assert await gw.limiter.admit(caller, Charge(5)) is not None

    asyncio.run(scenario())


def test_unused_tokens_go_back_to_redis(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with gateway(tmp_path) as gw:
            caller = await principal(gw.store, tpm=100)
            reservation = await gw.limiter.admit(caller, Charge(80))
            assert reservation is not None
            gw.limiter.give_back_rates(reservation, used_tokens=20)
            await asyncio.gather(*gw.limiter._refunds)
            assert await gw.limiter.admit(caller, Charge(80)) is not None

    asyncio.run(scenario())


def test_without_redis_the_limiter_counts_locally_and_says_so_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    async def scenario() -> None:
        async with gateway(tmp_path, f"redis://127.0.0.1:{closed_port()}/0") as gw:
            caller = await principal(gw.store, rpm=5)
            with caplog.at_level(logging.WARNING, logger="tokenrelay.limits.rates"):
                for _ in range(5):
                    assert await gw.limiter.admit(caller, Charge(10)) is not None
                with pytest.raises(RateLimited, match="5 requests per minute"):
                    await gw.limiter.admit(caller, Charge(10))
            assert gw.rates.down
            warnings = [r.getMessage() for r in caplog.records]
            assert len(warnings) == 1 and "is not answering" in warnings[0], warnings

    asyncio.run(scenario())
