"""Keys, limits and the ledger below the HTTP layer, on real SQLite files and a real PostgreSQL database."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import nullcontext
from datetime import timedelta
from pathlib import Path

import pytest
from accounting_support import postgres_database, sqlite_url
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import func, select
from waiting import until

from tokenrelay.auth.keysecrets import KEY_PREFIX, display_prefix, hash_secret, looks_like_key, new_secret
from tokenrelay.auth.keystore import KeySpec, KeyStore
from tokenrelay.auth.loopback import is_loopback
from tokenrelay.backends.base import Finish, TextDelta, TokenLogprob, Usage
from tokenrelay.calls.record import Call
from tokenrelay.config import AccountingSettings, Settings
from tokenrelay.errors import QuotaExceeded, RateLimited
from tokenrelay.limits.cost import Charge
from tokenrelay.limits.limiter import BudgetState, Limiter
from tokenrelay.store.database import create_engine, database_url
from tokenrelay.store.migrate import upgrade
from tokenrelay.store.schema import metadata, reservations, usage
from tokenrelay.store.timeutil import parse_expiry, utcnow
from tokenrelay.usage.ledger import Ledger
from tokenrelay.usage.rows import entry_for
from tokenrelay.usage.spill import SpillFiles
from tokenrelay.usage.writer import write_batch


@pytest.fixture(params=["sqlite", "postgresql"])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    with postgres_database() if request.param == "postgresql" else nullcontext(sqlite_url(tmp_path)) as value:
        yield value


def run(coro: object) -> object:
    return asyncio.run(coro)  # type: ignore[arg-type]


async def opened(url: str) -> tuple[object, KeyStore, Limiter]:
    engine = create_engine(database_url(Settings(database_url=url)))
    await upgrade(engine)
    return engine, KeyStore(engine), Limiter(engine)


# Secrets and small parsers ------------------------------------------------------------------------
def test_secrets_are_random_prefixed_and_only_hashed() -> None:
    a, b = new_secret(), new_secret()
    assert a != b and a.startswith(KEY_PREFIX) and len(a) >= 40 and looks_like_key(a)
    assert hash_secret(a) == hash_secret(a) != hash_secret(b) and a not in hash_secret(a)
    assert display_prefix(a) == a[:11] and not looks_like_key("sk-whatever-this-is")


def test_expiry_and_loopback_parsing() -> None:
    now = utcnow()
    assert parse_expiry("30d", now) - now == timedelta(days=30)
    assert parse_expiry("12h", now) - now == timedelta(hours=12)
    assert parse_expiry("2026-12-31").isoformat() == "2026-12-31T00:00:00"
    assert parse_expiry("2026-12-31T10:00:00+02:00").isoformat() == "2026-12-31T08:00:00"
    with pytest.raises(ValueError):
        parse_expiry("soon")
    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("localhost")
    assert not is_loopback("0.0.0.0") and not is_loopback("10.1.2.3") and not is_loopback("example.com")


def test_cut_calls_count_the_tokens_they_produced() -> None:
    call = Call(request_id="r", endpoint="completions", model="m")
    entry = TokenLogprob("a", -0.1, [97], [])
    for event in (TextDelta(0, "Hel"), TextDelta(0, "lo"), TextDelta(0, "", [entry, entry]), Finish(0, "stop")):
        call.saw(event)
    call.estimate_usage()
    assert (call.usage.completion_tokens, call.usage.estimated) == (4, True)
    reported = Call(request_id="r", endpoint="completions", model="m")
    reported.saw(TextDelta(0, "x"))
    reported.saw(Usage(prompt_tokens=3, completion_tokens=1))
    reported.estimate_usage()
    assert (reported.usage.prompt_tokens, reported.usage.estimated) == (3, False)


# Schema -------------------------------------------------------------------------------------------
def test_migrations_build_exactly_the_declared_schema(url: str) -> None:
    async def scenario() -> list[object]:
        engine, *_ = await opened(url)
        await upgrade(engine)  # a second run is a no-op
        async with engine.connect() as conn:
            diff = await conn.run_sync(lambda c: compare_metadata(MigrationContext.configure(c), metadata))
        await engine.dispose()
        return diff

    assert run(scenario()) == []


# Limits and settlement ----------------------------------------------------------------------------
def test_concurrent_admissions_never_overspend_a_budget(url: str) -> None:
    async def scenario() -> tuple[int, list[str]]:
        engine, store, limiter = await opened(url)
        record, secret = await store.create(KeySpec(name="b", budget_tokens=100))
        principal = await store.principal(hash_secret(secret))
        outcomes = await asyncio.gather(
            *(limiter.admit(principal, Charge(8)) for _ in range(40)), return_exceptions=True
        )
        admitted = [o for o in outcomes if not isinstance(o, Exception)]
        errors = sorted({type(o).__name__ for o in outcomes if isinstance(o, Exception)})
        state = await limiter.budget_state(record.id)
        used, reserved = state.tokens_used, state.tokens_reserved
        assert (used, reserved) == (0, 8 * len(admitted))
        await engine.dispose()
        return len(admitted), errors

    assert run(scenario()) == (12, [QuotaExceeded.__name__])


def test_settlement_happens_once_even_when_a_batch_is_written_twice(url: str) -> None:
    async def scenario() -> None:
        engine, store, limiter = await opened(url)
        _record, secret = await store.create(KeySpec(name="s", budget_tokens=1000, tpm=10_000))
        principal = await store.principal(hash_secret(secret))
        calls = []
        for i in range(3):
            call = Call(request_id=f"r{i}", endpoint="completions", model="m", key_id=principal.key_id)
            call.reservation = await limiter.admit(principal, Charge(50))
            call.usage = Usage(prompt_tokens=5, completion_tokens=7)
            calls.append(call)
        assert await limiter.budget_state(principal.key_id) == BudgetState(0, 150)
        entries = [entry_for(c) for c in calls]
        assert await write_batch(engine, entries) == 3
        assert await write_batch(engine, entries) == 0  # a retry after an unknown outcome changes nothing
        assert await limiter.budget_state(principal.key_id) == BudgetState(36, 0)
        async with engine.connect() as conn:
            assert (await conn.execute(select(func.count()).select_from(usage))).scalar() == 3
            assert (await conn.execute(select(func.count()).select_from(reservations))).scalar() == 0
        await engine.dispose()

    run(scenario())


def test_a_batch_line_run_again_is_charged_once_for_its_latest_run(url: str) -> None:
    async def scenario() -> None:
        engine, store, limiter = await opened(url)
        _record, secret = await store.create(KeySpec(name="l", budget_tokens=1000, budget_cost=10_000))
        principal = await store.principal(hash_secret(secret))

        async def run_of_the_line(started_at: float, completion_tokens: int) -> Call:
            call = Call(request_id="batch_b-3", endpoint="chat.completions", model="m", key_id=principal.key_id)
            call.batch_id, call.started_at, call.ended = "batch_b", started_at, call.started + 1
            call.reservation = await limiter.admit(principal, Charge(50, 500))
            call.usage = Usage(prompt_tokens=5, completion_tokens=completion_tokens)
            call.cost = 10 * call.usage.total_tokens  # what the ledger charges the key's money budget
            return call

        async def line_rows() -> list[int]:
            async with engine.connect() as conn:
                query = select(usage.c.completion_tokens).where(usage.c.request_id == "batch_b-3")
                return list((await conn.execute(query)).scalars())

        now = time.time()
        cut, oldest, answered = [entry_for(await run_of_the_line(now + t, n)) for t, n in ((0, 2), (-60, 4), (10, 9))]
        assert await write_batch(engine, [cut]) == 1  # a run cut by a shutdown: charged what it used
        assert await limiter.budget_state(principal.key_id) == BudgetState(7, 100, 70, 1000)
        assert await write_batch(engine, [answered]) == 1  # the line's next run replaces it
        assert await line_rows() == [9]
        assert await limiter.budget_state(principal.key_id) == BudgetState(14, 50, 140, 500)
        await write_batch(engine, [cut])  # a retried write of the replaced row brings nothing back
        assert await line_rows() == [9]
        assert await limiter.budget_state(principal.key_id) == BudgetState(14, 50, 140, 500)
        assert await write_batch(engine, [oldest]) == 1  # an older run replayed late loses to the latest
        assert await line_rows() == [9]
        assert await limiter.budget_state(principal.key_id) == BudgetState(14, 0, 140, 0)
        await engine.dispose()

    run(scenario())


def test_rate_limits_refuse_with_retry_after(url: str) -> None:
    async def scenario() -> None:
        engine, store, limiter = await opened(url)
        _record, secret = await store.create(KeySpec(name="r", rpm=2, tpm=100))
        principal = await store.principal(hash_secret(secret))
        await limiter.admit(principal, Charge(10))
        await limiter.admit(principal, Charge(10))
        with pytest.raises(RateLimited) as rpm:
            await limiter.admit(principal, Charge(10))
        assert 1 <= int(rpm.value.headers["Retry-After"]) <= 30 and "requests per minute" in rpm.value.message
        with pytest.raises(RateLimited) as too_big:
            await limiter.admit(principal, Charge(101))
        assert "more than the key's limit" in too_big.value.message
        await engine.dispose()

    run(scenario())


def test_stale_reservations_are_released(url: str) -> None:
    async def scenario() -> None:
        engine, store, limiter = await opened(url)
        record, secret = await store.create(KeySpec(name="crash", budget_tokens=100))
        principal = await store.principal(hash_secret(secret))
        await limiter.admit(principal, Charge(60))  # the replica "dies" without settling
        assert await limiter.release_stale(older_than=3600) == 0
        assert await limiter.budget_state(record.id) == BudgetState(0, 60)
        assert await limiter.release_stale(older_than=0) == 1
        assert await limiter.budget_state(record.id) == BudgetState(0, 0)
        await engine.dispose()

    run(scenario())


# The ledger ---------------------------------------------------------------------------------------
def _calls(n: int) -> list[Call]:
    return [Call(request_id=f"req-{i}", endpoint="chat.completions", model="m", usage=Usage(1, 2)) for i in range(n)]


async def _count(url: str) -> int:
    engine = create_engine(database_url(Settings(database_url=url)))
    async with engine.connect() as conn:
        count = (await conn.execute(select(func.count()).select_from(usage))).scalar()
    await engine.dispose()
    return int(count or 0)


@pytest.fixture
def sqlite_only(tmp_path: Path) -> str:
    return sqlite_url(tmp_path)


def test_ledger_batches_and_flushes_everything_on_close(sqlite_only: str, tmp_path: Path) -> None:
    async def scenario() -> int:
        engine, *_ = await opened(sqlite_only)
        ledger = Ledger(
            engine, AccountingSettings(ledger_flush_seconds=60, ledger_batch_size=7), SpillFiles(tmp_path, "s")
        )
        await ledger.start()
        for call in _calls(3):
            ledger.record(call)
        await asyncio.sleep(0.2)
        assert (ledger.pending, ledger.written) == (3, 0)  # less than a batch waits for the interval ...
        for call in _calls(17):
            ledger.record(call)
        await until(lambda: ledger.written == 20)  # ... a full batch wakes the writer long before the interval
        assert ledger.pending == 0
        for call in _calls(2):
            ledger.record(call)
        await ledger.close()  # and the close writes what is left
        await engine.dispose()
        return ledger.written

    assert run(scenario()) == 22
    assert run(_count(sqlite_only)) == 22


def test_ledger_catches_up_with_a_backlog_in_few_transactions(
    url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A writer that fell behind (rows queue while a slow transaction runs) takes the whole backlog, up to
    `ledger_max_rows`, in each next transaction rather than a wake-up batch at a time; both databases take a
    transaction of the default's size. (The engine's path: SQLite's inline writer keeps to small transactions,
    tested in `test_ledger_inline.py`.)"""
    sizes: list[int] = []

    async def counted(engine: object, entries: list, **options: bool) -> int:
        sizes.append(len(entries))
        await asyncio.sleep(0.05)  # a transaction under load: rows keep arriving while it runs
        return await write_batch(engine, entries, **options)

    monkeypatch.setattr("tokenrelay.usage.ledger.write_batch", counted)

    async def scenario() -> int:
        engine, *_ = await opened(url)
        settings = AccountingSettings(ledger_flush_seconds=60, ledger_batch_size=5, ledger_inline_sqlite=False)
        ledger = Ledger(engine, settings, SpillFiles(tmp_path, "s"))
        await ledger.start()
        for call in _calls(settings.ledger_max_rows + 500):
            ledger.record(call)
        await until(lambda: ledger.written == settings.ledger_max_rows + 500)
        await ledger.close()
        await engine.dispose()
        return ledger.written

    rows = AccountingSettings().ledger_max_rows + 500
    assert run(scenario()) == rows
    assert sizes == [rows - 500, 500]
    assert run(_count(url)) == rows


def test_a_batch_committed_before_its_error_is_settled_once_on_the_retry(
    url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """New rows are inserted without asking which are new; a batch whose outcome is unknown (here, it
    committed and then the connection "failed") is retried asking, so its rows and its settlement count once."""
    asked: list[bool] = []
    sizes: list[int] = []

    async def commits_then_fails_once(engine: object, entries: list, *, maybe_written: bool = True) -> int:
        asked.append(maybe_written)
        sizes.append(len(entries))
        written = await write_batch(engine, entries, maybe_written=maybe_written)
        if len(asked) == 1:
            raise OSError("connection lost while reading the commit's answer")
        return written

    monkeypatch.setattr("tokenrelay.usage.ledger.write_batch", commits_then_fails_once)
    monkeypatch.setattr("tokenrelay.usage.ledger.RETRY_SECONDS", (0.05,))

    async def scenario() -> tuple[int, tuple[int, int]]:
        engine, store, limiter = await opened(url)
        _record, secret = await store.create(KeySpec(name="retry", budget_tokens=1000))
        principal = await store.principal(hash_secret(secret))
        ledger = Ledger(engine, AccountingSettings(ledger_flush_seconds=60), SpillFiles(tmp_path, "s"))
        await ledger.start()
        calls = _calls(4)
        for call in calls:
            call.key_id, call.reservation = principal.key_id, await limiter.admit(principal, Charge(50))
            ledger.record(call)  # a row that settles a reservation wakes the writer at once
        await until(lambda: len(asked) >= 2 and not ledger.settling(principal.key_id))  # retried and settled
        for call in _calls(3):
            ledger.record(call)
        await ledger.close()
        state = await limiter.budget_state(principal.key_id)
        await engine.dispose()
        return ledger.written, state

    written, state = run(scenario())
    assert asked[:2] == [False, True]  # a first try asks nothing back; the retry asks which rows are new
    assert asked[2:] == [False] * len(asked[2:])  # and later batches are first tries again
    assert written == 7 - sizes[0]  # the first batch's rows were new only on the try that "failed"
    assert state == BudgetState(4 * 3, 0)  # settled once: 1 prompt + 2 completion tokens each
    assert run(_count(url)) == 7


async def _unreachable_ledger(spills: SpillFiles) -> None:
    engine = create_engine(database_url(Settings(database_url="postgresql://nobody@127.0.0.1:1/nowhere")))
    ledger = Ledger(engine, AccountingSettings(ledger_flush_seconds=0.05), spills)
    await ledger.start()  # nothing spilled yet, so nothing to replay
    for call in _calls(5):
        ledger.record(call)
    await ledger.close(timeout=1.0)
    await engine.dispose()


def _exited_pid() -> int:
    process = subprocess.Popen([sys.executable, "-c", "pass"])
    process.wait()
    return process.pid


def test_rows_the_database_refuses_at_shutdown_are_spilled_and_replayed(sqlite_only: str, tmp_path: Path) -> None:
    # Written by a worker that has exited since; another, still running (our parent), has a file too.
    exited = SpillFiles(tmp_path, "tag", pid=_exited_pid())
    running = SpillFiles(tmp_path, "tag", pid=os.getppid())
    run(_unreachable_ledger(exited))
    assert len(exited.own.read_text().splitlines()) == 5
    running.own.write_text(exited.own.read_text())

    async def replay() -> None:
        engine, *_ = await opened(sqlite_only)
        ledger = Ledger(engine, AccountingSettings(), SpillFiles(tmp_path, "tag"))
        await ledger.start()
        await ledger.close()
        await engine.dispose()

    run(replay())
    assert not exited.own.exists() and run(_count(sqlite_only)) == 5
    assert running.own.exists()  # its writer may still be appending: left for a start after it has gone
    assert sorted(p.name for p in tmp_path.glob("ledger-spill-*")) == [running.own.name]


def test_an_unreachable_key_store_is_a_503_not_a_crash() -> None:
    from tokenrelay.auth.verifier import KeyVerifier
    from tokenrelay.errors import Overloaded

    async def scenario() -> None:
        settings = Settings(database_url="postgresql://nobody@127.0.0.1:1/nowhere")
        engine = create_engine(database_url(settings))
        verifier = KeyVerifier(KeyStore(engine), settings)
        with pytest.raises(Overloaded) as caught:
            await verifier.verify(new_secret())
        assert caught.value.status == 503 and caught.value.headers["Retry-After"] == "2"
        await engine.dispose()

    run(scenario())


class CountingStore(KeyStore):
    """The real key store, counting its lookups."""

    lookups = 0

    async def principal(self, secret_hash: str) -> object:
        self.lookups += 1
        await asyncio.sleep(0.05)
        return await super().principal(secret_hash)


def test_verified_keys_are_looked_up_once_then_cached_briefly(tmp_path: Path) -> None:
    from tokenrelay.auth.verifier import KeyVerifier

    async def scenario() -> None:
        url = sqlite_url(tmp_path)
        engine, store, _ = await opened(url)
        _record, secret = await store.create(KeySpec(name="cached"))
        counting = CountingStore(engine)
        verifier = KeyVerifier(
            counting, Settings(database_url=url, accounting=AccountingSettings(key_cache_seconds=0.3))
        )
        found = await asyncio.gather(*(verifier.verify(secret) for _ in range(50)))
        assert {p.name for p in found} == {"cached"} and counting.lookups == 1
        unknown = new_secret()
        gone, waiting = (asyncio.create_task(verifier.verify(unknown)) for _ in range(2))
        await asyncio.sleep(0.01)
        gone.cancel()  # the caller whose miss started the lookup disconnects; the other still gets its answer
        assert await waiting is None
        await store.revoke("cached")
        assert (await verifier.verify(secret)).name == "cached"  # still cached ...
        await asyncio.sleep(0.35)
        assert await verifier.verify(secret) is None  # ... until the cache time passes
        await engine.dispose()

    run(scenario())
