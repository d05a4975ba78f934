"""SQLite ledger rows written on the event loop: the same rows as the engine writes, never a wait for the lock."""

from __future__ import annotations

import asyncio
import sqlite3
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from accounting_support import sqlite_url
from sqlalchemy import select
from waiting import until

from tokenrelay.auth.keyspec import KeySpec
from tokenrelay.auth.keystore import KeyStore
from tokenrelay.backends.base import Usage
from tokenrelay.calls.record import Call
from tokenrelay.config import AccountingSettings, Settings
from tokenrelay.store.database import create_engine, database_url
from tokenrelay.store.migrate import upgrade
from tokenrelay.store.schema import api_keys, usage
from tokenrelay.usage import inline
from tokenrelay.usage import ledger as ledger_module
from tokenrelay.usage.inline import InlineWriter, inline_path
from tokenrelay.usage.ledger import Ledger
from tokenrelay.usage.rows import entry_for
from tokenrelay.usage.spill import SpillFiles
from tokenrelay.usage.writer import write_batch


def calls(n: int, key_id: str | None = None, **fields: Any) -> list[Call]:
    made = []
    for i in range(n):
        call = Call(request_id=f"req-{i}", endpoint="chat.completions", model="m", usage=Usage(3, 5, 1), **fields)
        call.key_id, call.key_name, call.backend, call.status = key_id, "k", "upstream", 200 + i % 2
        call.finish_reasons, call.first_token_at, call.ended = ["stop"], call.started + 0.01, call.started + 0.5
        made.append(call)
    return made


@asynccontextmanager
async def database(tmp_path: Path) -> AsyncIterator[tuple[Any, str]]:
    url = sqlite_url(tmp_path)
    engine = create_engine(database_url(Settings(database_url=url)))
    await upgrade(engine)
    try:
        yield engine, str(inline_path(engine.url))
    finally:
        await engine.dispose()


async def rows(engine: Any) -> list[dict[str, Any]]:
    async with engine.connect() as conn:
        result = await conn.execute(select(usage).order_by(usage.c.request_id, usage.c.id))
        return [dict(row._mapping) for row in result]


def test_only_a_sqlite_file_gets_an_inline_writer(tmp_path: Path) -> None:
    for url, expected in [
        (sqlite_url(tmp_path), str(tmp_path / "tokenrelay-test.db")),
        ("sqlite:///:memory:", None),
        ("postgresql://x@127.0.0.1/db", None),
    ]:
        assert inline_path(database_url(Settings(database_url=url))) == expected


def stored(path: str) -> list[tuple[Any, ...]]:
    """The rows as SQLite holds them (text, integers), without any type's reading."""
    with sqlite3.connect(path) as conn:
        return conn.execute("SELECT * FROM usage ORDER BY request_id, id").fetchall()


def test_inline_rows_are_stored_exactly_as_the_engine_stores_them(tmp_path: Path) -> None:
    async def scenario() -> tuple[list[Any], list[Any], list[Any], list[Any]]:
        async with database(tmp_path) as (engine, path):
            made = calls(6, user="u\u00e9", streamed=True)
            made[0].started_at = 1_700_000_000.0  # a whole second: no microseconds to write
            batch = [entry_for(call) for call in made]
            await write_batch(engine, batch, maybe_written=False)
            by_engine, engine_text = await rows(engine), stored(path)
            async with engine.begin() as conn:
                await conn.execute(usage.delete())
            writer = InlineWriter(path)
            assert writer.write(batch)
            writer.close()
            return by_engine, engine_text, await rows(engine), stored(path)

    by_engine, engine_text, by_inline, inline_text = asyncio.run(scenario())
    assert len(by_inline) == 6
    assert inline_text == engine_text  # the same text and numbers in every column
    assert by_inline == by_engine  # and the same values read back through the engine's types
    started_at = [c.name for c in usage.columns].index("started_at")
    assert any(str(row[started_at]).endswith(".000000") for row in inline_text)


def test_inline_writes_note_each_keys_last_use_and_never_move_it_back(tmp_path: Path) -> None:
    async def scenario() -> list[Any]:
        async with database(tmp_path) as (engine, path):
            record, _secret = await KeyStore(engine).create(KeySpec(name="k"))
            writer = InlineWriter(path)
            seen = []
            for shift in (100.0, -50.0, 200.0):  # a later batch, then an older one, then a later one again
                batch = calls(2, key_id=record.id)
                for call in batch:
                    call.started_at += shift
                assert writer.write([entry_for(call) for call in batch])
                async with engine.connect() as conn:
                    query = select(api_keys.c.last_used_at).where(api_keys.c.id == record.id)
                    seen.append((await conn.execute(query)).scalar_one())
            writer.close()
            return seen

    first, after_older, last = asyncio.run(scenario())
    assert first is not None and after_older == first and last > first


def test_a_taken_write_lock_is_never_waited_for_on_the_loop(tmp_path: Path) -> None:
    """While another connection holds SQLite's write lock the inline writer refuses at once; the ledger tries
    again a moment later, then sends the batch through the engine, whose thread waits, and the loop keeps
    serving all along; the rows land once the lock is free."""

    async def scenario() -> tuple[bool, float, int, int]:
        async with database(tmp_path) as (engine, path):
            holder = sqlite3.connect(path, isolation_level=None)
            holder.execute("BEGIN IMMEDIATE")
            writer = InlineWriter(path)
            started = time.monotonic()
            refused = not writer.write([entry_for(call) for call in calls(1)])
            refusal_took = time.monotonic() - started
            writer.close()

            ledger = Ledger(engine, AccountingSettings(ledger_flush_seconds=60), SpillFiles(tmp_path, "s"))
            await ledger.start()
            for call in calls(3):
                ledger.record(call)
            ticks = 0
            flushing = asyncio.ensure_future(ledger.flush())
            for _ in range(20):  # 0.2 s with the lock held: the loop must keep turning
                await asyncio.sleep(0.01)
                ticks += 1
            assert not flushing.done()
            holder.execute("COMMIT")
            holder.close()
            await asyncio.wait_for(flushing, 10)
            await ledger.close()
            return refused, refusal_took, ticks, len(await rows(engine))

    refused, refusal_took, ticks, written = asyncio.run(scenario())
    assert refused and refusal_took < 0.05
    assert ticks == 20
    assert written == 3


def held_lock_scenario(tmp_path: Path, hold: float) -> tuple[int, list[int]]:
    """Rows recorded while another connection holds the write lock for `hold` seconds: how many were written,
    and the batch sizes that went through the engine (`write_batch`) instead of the inline writer."""

    async def scenario() -> tuple[int, list[int]]:
        async with database(tmp_path) as (engine, path):
            ledger = Ledger(engine, AccountingSettings(ledger_flush_seconds=60), SpillFiles(tmp_path, "s"))
            await ledger.start()
            holder = sqlite3.connect(path, isolation_level=None)
            holder.execute("BEGIN IMMEDIATE")
            for call in calls(4):
                ledger.record(call)
            flushing = asyncio.ensure_future(ledger.flush())
            await asyncio.sleep(hold)
            holder.execute("COMMIT")
            holder.close()
            await asyncio.wait_for(flushing, 10)
            await ledger.close()
            return len(await rows(engine)), through_engine

    through_engine: list[int] = []
    original = ledger_module.write_batch

    async def counted(engine: Any, batch: list[Any], **kwargs: Any) -> int:
        through_engine.append(len(batch))
        return await original(engine, batch, **kwargs)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(ledger_module, "write_batch", counted)
        patch.setattr(ledger_module, "LOCKED_PATIENCE_SECONDS", 0.3)
        return asyncio.run(scenario())


def test_a_batch_locked_out_for_a_moment_is_still_written_inline(tmp_path: Path) -> None:
    # Another worker's inline transaction holds the lock for a few ms: the batch waits for it on the loop's
    # timers instead of taking the engine's slow path (which would hold the lock long and lock the others out).
    written, through_engine = held_lock_scenario(tmp_path, hold=0.05)
    assert written == 4 and through_engine == []


def test_a_batch_locked_out_past_the_patience_goes_through_the_engine(tmp_path: Path) -> None:
    written, through_engine = held_lock_scenario(tmp_path, hold=0.6)
    assert written == 4 and through_engine == [4]


def test_a_backlog_is_written_in_small_transactions_with_the_loop_served_between(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sizes: list[int] = []
    turns: list[int] = []
    write = InlineWriter.write

    def counted(self: InlineWriter, entries: list[Any]) -> bool:
        sizes.append(len(entries))
        turns.append(ticker_turns[0])
        return write(self, entries)

    monkeypatch.setattr(InlineWriter, "write", counted)
    ticker_turns = [0]

    async def ticker() -> None:
        while True:
            ticker_turns[0] += 1
            await asyncio.sleep(0)

    async def scenario() -> int:
        async with database(tmp_path) as (engine, _path):
            ledger = Ledger(engine, AccountingSettings(ledger_flush_seconds=60), SpillFiles(tmp_path, "s"))
            await ledger.start()
            for call in calls(inline.MAX_ROWS * 2 + 7):
                ledger.record(call)
            ticking = asyncio.ensure_future(ticker())
            await ledger.flush()
            ticking.cancel()
            await ledger.close()
            return len(await rows(engine))

    assert asyncio.run(scenario()) == inline.MAX_ROWS * 2 + 7
    assert sizes == [inline.MAX_ROWS, inline.MAX_ROWS, 7]
    assert turns[0] < turns[1] < turns[2]  # other tasks ran between two transactions


def test_the_wal_is_checkpointed_through_the_engine_not_by_the_inline_writes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("tokenrelay.usage.ledger.CHECKPOINT_ROWS", 300)

    async def scenario() -> tuple[int, int, int]:
        async with database(tmp_path) as (engine, path):
            ledger = Ledger(engine, AccountingSettings(ledger_flush_seconds=60), SpillFiles(tmp_path, "s"))
            await ledger.start()
            before = Path(path).stat().st_size
            for call in calls(200):
                ledger.record(call)
            await ledger.flush()
            below_threshold = Path(path).stat().st_size  # committed to the WAL; the database file untouched
            for call in calls(200):
                ledger.record(call)
            await ledger.flush()  # past 300 rows: checkpointed
            after = Path(path).stat().st_size
            await ledger.close()
            return before, below_threshold, after

    before, below_threshold, after = asyncio.run(scenario())
    assert below_threshold == before
    assert after > before


def test_rows_that_arrive_during_a_write_wait_for_a_full_batch_or_the_interval(tmp_path: Path) -> None:
    # A busy server writes large transactions: a few rows that came in while a batch was written are not a
    # transaction of their own straight away.
    async def scenario() -> tuple[list[int], int, list[int], int]:
        async with database(tmp_path) as (engine, _path):
            settings = AccountingSettings(ledger_flush_seconds=0.3, ledger_batch_size=10)
            ledger = Ledger(engine, settings, SpillFiles(tmp_path, "s"))
            sizes: list[int] = []
            write = ledger._write

            async def noted(batch: list[Any], inline_writer: Any) -> int:
                sizes.append(len(batch))
                if len(sizes) == 1:
                    for call in calls(3):  # requests that end while the first batch is written
                        ledger.record(call)
                return await write(batch, inline_writer)

            ledger._write = noted  # type: ignore[method-assign]
            await ledger.start()
            for call in calls(10):  # a full batch: written at once
                ledger.record(call)
            await until(lambda: ledger.written == 10)
            early, pending = list(sizes), ledger.pending
            await until(lambda: ledger.written == 13)  # once the interval passes, the rest is written
            late = list(sizes)
            await ledger.close()
            return early, pending, late, len(await rows(engine))

    early, pending, late, written = asyncio.run(scenario())
    assert early == [10] and pending == 3
    assert late == [10, 3] and written == 13
