"""The usage ledger: calls are queued in memory as they end and written in batches by one background task.

Nothing is written on the request path. Under load a transaction takes a long time however few rows it
holds (each of its database round trips waits behind every request the event loop is serving), so the writer
takes everything queued, up to `ledger_max_rows`, in one: it keeps up at any rate the server can serve instead
of queueing without bound.

With SQLite, first-time rows that settle nothing are written on the loop itself (`tokenrelay.usage.inline`),
in transactions of at most `inline.MAX_ROWS` with the loop served between them; a batch that finds SQLite's
lock taken is tried again for a moment (`LOCKED_PATIENCE_SECONDS`), and one that still finds it taken, or
that settles reservations, goes through the engine as before.

`close()` (the app's shutdown) writes everything still queued, and whatever the database refuses until the
deadline is spilled to a file that the next start replays.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from pathlib import Path

from opentelemetry.context import Context
from opentelemetry.trace import Link, Tracer
from sqlalchemy.ext.asyncio import AsyncEngine

from tokenrelay.calls.record import Call
from tokenrelay.config import AccountingSettings
from tokenrelay.usage.inline import CHECKPOINT_ROWS, MAX_ROWS, InlineWriter, inline_path
from tokenrelay.usage.rows import LedgerEntry, entry_for
from tokenrelay.usage.spill import SpillFiles, read_spill, spill
from tokenrelay.usage.writer import write_batch

log = logging.getLogger(__name__)

RETRY_SECONDS = (0.5, 1, 2, 5)
# A batch the inline writer finds locked out is tried again this often, for this long, before it goes through
# the engine. The lock is mostly another worker's short inline transaction; a batch sent through the engine
# holds the lock much longer under load (each statement waits for its turn on the loop), locking the other
# workers out in turn.
LOCKED_RETRY_SECONDS = 0.002
LOCKED_PATIENCE_SECONDS = 0.25


class Ledger:
    def __init__(
        self, engine: AsyncEngine, settings: AccountingSettings, spills: SpillFiles, tracer: Tracer | None = None
    ) -> None:
        self.engine = engine
        self.tracer = tracer  # set when traces are exported: each write is a span linked to its calls' spans
        self.settings = settings
        self.spills = spills
        self.written = 0
        self._pending: deque[LedgerEntry] = deque()
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._closing = False
        self._failures = 0
        self._writing = asyncio.Lock()
        self._in_batch: list[LedgerEntry] = []
        self._inline: InlineWriter | None = None

    def record(self, call: Call) -> None:
        entry = entry_for(call)
        if self._task is None or self._task.done():
            spill(self.spills.own, [entry])  # after close(): a straggler still reaches the next start
            return
        self._pending.append(entry)
        # A row that settles a reservation is written at once (with whatever else is queued by then): until
        # it is, the key's budget and token bucket still hold the request's worst case.
        if entry.reservation is not None or len(self._pending) >= self.settings.ledger_batch_size:
            self._wake.set()

    @property
    def pending(self) -> int:
        return len(self._pending)

    async def start(self) -> None:
        await self._replay_spills()
        path = inline_path(self.engine.url) if self.settings.ledger_inline_sqlite else None
        if path is not None:
            self._inline = InlineWriter(path)
        self._task = asyncio.create_task(self._run(), name="ledger-writer")

    async def _replay_spills(self) -> None:
        for path in self.spills.left_over():
            if self.spills.claim(path):
                await self._replay(self.spills.own)

    async def _replay(self, path: Path) -> None:
        entries = read_spill(path)
        new = 0
        for start in range(0, len(entries), self.settings.ledger_max_rows):
            new += await write_batch(self.engine, entries[start : start + self.settings.ledger_max_rows])
        path.unlink()
        log.info("ledger: replayed %d spilled row(s) (%d new)", len(entries), new)

    async def _run(self) -> None:
        while not (self._closing and not self._pending):
            await self._sleep()
            await self._write_pending(everything=self._closing)

    async def _sleep(self) -> None:
        delay = self.settings.ledger_flush_seconds
        if self._failures:
            delay = RETRY_SECONDS[min(self._failures, len(RETRY_SECONDS)) - 1]
        with contextlib.suppress(TimeoutError):  # the flush interval passed without a full batch
            await asyncio.wait_for(self._wake.wait(), timeout=delay)
        self._wake.clear()

    async def _write_pending(self, everything: bool = True) -> None:
        """Write what is queued. Unless `everything`, only a full batch is written after the first: rows
        that arrive while a batch is written wait for the next wake (a full batch, a reservation, the
        interval), so a busy server writes large transactions, not one after each few requests."""
        async with self._writing:  # one batch at a time, so a flush() returns only once all is committed
            first = True
            while self._pending and (everything or first or len(self._pending) >= self.settings.ledger_batch_size):
                first = False
                inline = self._inline if not self._failures else None  # a retry may find its rows written
                limit = (
                    self.settings.ledger_max_rows if inline is None else min(self.settings.ledger_max_rows, MAX_ROWS)
                )
                size = min(len(self._pending), limit)
                batch = [self._pending.popleft() for _ in range(size)]
                self._in_batch = batch
                try:
                    self.written += await self._write(batch, inline)
                except Exception:
                    self._pending.extendleft(reversed(batch))  # keep order; rows carry their ids, so retrying is safe
                    self._failures += 1
                    log.exception("ledger: writing %d row(s) failed; retrying", len(batch))
                    return
                finally:
                    self._in_batch = []
                self._failures = 0
            await self._checkpoint()

    async def _write(self, batch: list[LedgerEntry], inline: InlineWriter | None) -> int:
        if self.tracer is None:
            return await self._write_rows(batch, inline)
        links = [Link(entry.span_context) for entry in batch if entry.span_context is not None]
        with self.tracer.start_as_current_span("ledger write", context=Context(), links=links) as span:
            span.set_attribute("tokenrelay.ledger.rows", len(batch))
            return await self._write_rows(batch, inline)

    async def _write_rows(self, batch: list[LedgerEntry], inline: InlineWriter | None) -> int:
        if inline is not None and inline.takes(batch) and await _written_inline(inline, batch):
            await asyncio.sleep(0)  # the loop serves its requests between two transactions of a backlog
            return len(batch)
        # After a failure the batch put back may have been committed (an unknown outcome).
        maybe_written = self._failures > 0
        return await write_batch(self.engine, batch, maybe_written=maybe_written)

    async def _checkpoint(self, every: int | None = None) -> None:
        """The WAL's pages moved into the database file, through the engine's thread (never on the loop)."""
        if self._inline is None or self._inline.since_checkpoint < (CHECKPOINT_ROWS if every is None else every):
            return
        self._inline.since_checkpoint = 0
        try:
            async with self.engine.connect() as conn:
                await conn.exec_driver_sql("PRAGMA wal_checkpoint(PASSIVE)")
        except Exception:  # a later checkpoint will do; the rows are committed already
            log.exception("ledger: checkpointing the SQLite WAL failed")

    async def flush(self) -> None:
        """Write everything queued now (reports that must see the latest requests, admissions that must see
        this replica's settled reservations)."""
        await self._write_pending()

    def settling(self, key_id: str) -> bool:
        """Whether a finished request of this key still holds a reservation that this ledger has yet to settle."""
        queued = (*self._pending, *self._in_batch)
        return any(e.reservation is not None and e.reservation.key_id == key_id for e in queued)

    async def close(self, timeout: float = 15.0) -> None:
        if self._task is None:
            return
        self._closing = True
        self._wake.set()
        try:
            await asyncio.wait_for(asyncio.shield(self._task), timeout)
        except TimeoutError:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        if self._pending:
            spill(self.spills.own, list(self._pending))
            self._pending.clear()
        if self._inline is not None:
            await self._checkpoint(every=1)
            self._inline.close()
            self._inline = None


async def _written_inline(inline: InlineWriter, batch: list[LedgerEntry]) -> bool:
    """Whether the inline writer took the batch, trying again while another connection holds the write lock
    (never blocking the loop: each try is refused at once), up to `LOCKED_PATIENCE_SECONDS`."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + LOCKED_PATIENCE_SECONDS
    while not inline.write(batch):
        if loop.time() >= deadline:
            return False
        await asyncio.sleep(LOCKED_RETRY_SECONDS)
    return True
