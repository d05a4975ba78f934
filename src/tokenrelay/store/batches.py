"""Batches and their lines in the database, shared by every replica.

Every change of a batch's state is a conditional update (`WHERE status = <the state it leaves>`), so when two
replicas race to validate, finalize or cancel one batch, one wins and the other's transaction is rolled back.
Lines are claimed in one statement (`FOR UPDATE SKIP LOCKED` on PostgreSQL; SQLite's single writer serializes
it), and a line's result is accepted only from the claim that still holds it: a line that ran on a replica
that stalled past its lease, and was taken again, is answered once.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from sqlalchemy import ColumnElement, func, insert, select, tuple_, update
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from tokenrelay.principal import Principal
from tokenrelay.store.ids import time_ordered_id
from tokenrelay.store.ownership import visible_to
from tokenrelay.store.schema import batch_lines, batches, files
from tokenrelay.store.timeutil import utcnow

B, L = batches.c, batch_lines.c


@dataclass(frozen=True, slots=True)
class InputLine:
    """A line of a batch's input file, checked: its number, its `custom_id` and its request body."""

    line: int
    custom_id: str
    body: dict[str, Any]


STATES = ("validating", "in_progress", "finalizing", "completed", "failed", "expired", "cancelling", "cancelled")


@dataclass(frozen=True, slots=True)
class ClaimedLine:
    batch_id: str
    line: int
    custom_id: str
    body: dict[str, Any]
    endpoint: str
    key_id: str | None


@dataclass(frozen=True, slots=True)
class LineResult:
    status_code: int
    result: dict[str, Any]  # the output (or error) file's line
    input_tokens: int = 0
    cached_tokens: int = 0
    output_tokens: int = 0
    reasoning_tokens: int = 0


class BatchStore:
    def __init__(self, engine: AsyncEngine) -> None:
        self.engine = engine

    # The API's side ---------------------------------------------------------------------------------------
    async def create(
        self, principal: Principal, endpoint: str, input_file_id: str, metadata: dict[str, str] | None, window: float
    ) -> dict[str, Any]:
        now = utcnow()
        batch_id = f"batch_{time_ordered_id()}"
        values = {
            "id": batch_id,
            "key_id": principal.key_id,
            "endpoint": endpoint,
            "input_file_id": input_file_id,
            "completion_window": "24h",
            "status": "validating",
            "metadata": metadata,
            "total": 0,
            "completed": 0,
            "failed": 0,
            "created_at": now,
            "expires_at": now + timedelta(seconds=window),
        }
        async with self.engine.begin() as conn:
            await conn.execute(insert(batches).values(values))
        created = await self._read(batch_id)
        assert created is not None  # written just now, in a transaction of its own
        return created

    async def get(self, principal: Principal, batch_id: str) -> dict[str, Any] | None:
        return await self._read(batch_id, visible_to(batches, principal))

    async def page(self, principal: Principal, after: str | None, limit: int) -> list[dict[str, Any]]:
        """Newest first (ids are time-ordered); `after` is the last id of the previous page."""
        query = select(batches).where(visible_to(batches, principal))
        if after is not None:
            query = query.where(B.id < after)
        async with self.engine.connect() as conn:
            rows = [row._asdict() for row in await conn.execute(query.order_by(B.id.desc()).limit(limit))]
            return [await _with_progress(conn, row) for row in rows]

    async def cancel(self, principal: Principal, batch_id: str) -> dict[str, Any] | None:
        """Ask a batch to stop: `cancelling` until the lines running now are done. None: not the caller's."""
        found = await self.get(principal, batch_id)
        if found is None:
            return None
        if found["status"] in ("validating", "in_progress"):
            query = update(batches).where(B.id == batch_id, B.status == found["status"])
            async with self.engine.begin() as conn:
                await conn.execute(query.values(status="cancelling", cancelling_at=utcnow()))
        return await self._read(batch_id)

    async def _read(self, batch_id: str, *where: ColumnElement[bool]) -> dict[str, Any] | None:
        async with self.engine.connect() as conn:
            row = (await conn.execute(select(batches).where(B.id == batch_id, *where))).first()
            return None if row is None else await _with_progress(conn, row._asdict())

    # The runner's side ------------------------------------------------------------------------------------
    async def input_content(self, file_id: str) -> bytes | None:
        async with self.engine.connect() as conn:
            return (await conn.execute(select(files.c.content).where(files.c.id == file_id))).scalar()

    async def validating(self) -> list[dict[str, Any]]:
        async with self.engine.connect() as conn:
            rows = await conn.execute(select(batches).where(B.status == "validating").order_by(B.id).limit(8))
            return [row._asdict() for row in rows]

    async def start(self, batch_id: str, lines: list[InputLine]) -> bool:
        """The validated lines stored and the batch `in_progress`, in one transaction; False if it left
        `validating` meanwhile (cancelled, or another replica started it)."""
        values = [
            {
                "batch_id": batch_id,
                "line": line.line,
                "custom_id": line.custom_id,
                "body": line.body,
                "state": "pending",
                "input_tokens": 0,
                "cached_tokens": 0,
                "output_tokens": 0,
            }
            for line in lines
        ]
        async with self.engine.begin() as conn:
            moved = await conn.execute(
                update(batches)
                .where(B.id == batch_id, B.status == "validating")
                .values(status="in_progress", in_progress_at=utcnow(), total=len(lines))
            )
            if moved.rowcount != 1:
                await conn.rollback()
                return False
            for start in range(0, len(values), 1000):
                await conn.execute(insert(batch_lines), values[start : start + 1000])
        return True

    async def fail(self, batch_id: str, errors: list[dict[str, Any]]) -> None:
        query = update(batches).where(B.id == batch_id, B.status == "validating")
        body = {"object": "list", "data": errors}
        async with self.engine.begin() as conn:
            await conn.execute(query.values(status="failed", failed_at=utcnow(), errors=body))

    async def claim(self, claim: str, count: int, lease: float) -> list[ClaimedLine]:
        """Up to `count` lines of running batches, oldest batch first: pending ones, or ones whose claim went
        stale (not renewed for `lease` seconds: its replica died)."""
        now = utcnow()
        runnable = select(B.id).where(B.status == "in_progress", B.expires_at > now)
        free = (L.state == "pending") | ((L.state == "running") & (L.claimed_at < now - timedelta(seconds=lease)))
        chosen = (
            select(L.batch_id, L.line)
            .where(L.batch_id.in_(runnable), free)
            .order_by(L.batch_id, L.line)
            .limit(count)
            .with_for_update(skip_locked=True)
        )
        query = (
            update(batch_lines)
            .where(tuple_(L.batch_id, L.line).in_(chosen))
            .values(state="running", claim=claim, claimed_at=now)
            .returning(L.batch_id, L.line, L.custom_id, L.body)
        )
        async with self.engine.begin() as conn:
            rows = (await conn.execute(query)).all()
            owners = await _owners(conn, {row.batch_id for row in rows})
        return [ClaimedLine(r.batch_id, r.line, r.custom_id, r.body, *owners[r.batch_id]) for r in rows]

    async def renew(self, claim: str) -> None:
        query = update(batch_lines).where(L.claim == claim, L.state == "running").values(claimed_at=utcnow())
        async with self.engine.begin() as conn:
            await conn.execute(query)

    async def finish(self, line: ClaimedLine, claim: str, result: LineResult) -> bool:
        """Record a line's answer; False (and nothing recorded) if its claim is no longer this one's."""
        query = (
            update(batch_lines)
            .where(L.batch_id == line.batch_id, L.line == line.line, L.claim == claim, L.state == "running")
            .values(
                state="done",
                status_code=result.status_code,
                result=result.result,
                input_tokens=result.input_tokens,
                cached_tokens=result.cached_tokens,
                output_tokens=result.output_tokens,
                reasoning_tokens=result.reasoning_tokens,
            )
        )
        async with self.engine.begin() as conn:
            return (await conn.execute(query)).rowcount == 1

    async def release(self, line: ClaimedLine, claim: str) -> None:
        """Put a claimed line back (shutting down, or the key is rate-limited for now): it runs again later."""
        query = update(batch_lines).where(
            L.batch_id == line.batch_id, L.line == line.line, L.claim == claim, L.state == "running"
        )
        async with self.engine.begin() as conn:
            await conn.execute(query.values(state="pending", claim=None, claimed_at=None))

    async def ending(self, lease: float) -> list[tuple[dict[str, Any], str]]:
        """Batches ready to end, with the state each ends in: every line done (`completed`), or stopped
        (`cancelled`, `expired`) with none running under a live claim."""
        now = utcnow()
        live = (L.state == "running") & (L.claimed_at >= now - timedelta(seconds=lease))
        async with self.engine.connect() as conn:
            rows = [
                r._asdict()
                for r in await conn.execute(select(batches).where(B.status.in_(("in_progress", "cancelling"))))
            ]
            ready = []
            for batch in rows:
                counts = await _line_counts(conn, batch["id"], live)
                if batch["status"] == "cancelling" and counts["live"] == 0:
                    ready.append((batch, "cancelled"))
                elif batch["expires_at"] <= now and counts["live"] == 0:
                    ready.append((batch, "expired"))
                elif batch["status"] == "in_progress" and counts["undone"] == 0:
                    ready.append((batch, "completed"))
            return ready

    async def done_lines(self, batch_id: str) -> list[dict[str, Any]]:
        query = select(batch_lines).where(L.batch_id == batch_id).order_by(L.line)
        async with self.engine.connect() as conn:
            return [row._asdict() for row in await conn.execute(query)]

    async def end(
        self, batch: dict[str, Any], state: str, values: dict[str, Any], written: list[dict[str, Any]]
    ) -> bool:
        """The batch in its final `state` with its files, in one transaction; False if another replica ended it."""
        now = utcnow()
        stamp = {"finalizing_at": now, f"{state}_at": now} if state == "completed" else {f"{state}_at": now}
        async with self.engine.begin() as conn:
            query = update(batches).where(B.id == batch["id"], B.status == batch["status"])
            moved = await conn.execute(query.values(status=state, **stamp, **values))
            if moved.rowcount != 1:
                await conn.rollback()
                return False
            for file in written:
                await conn.execute(insert(files).values(file))
        return True

    async def counts_by_status(self) -> dict[str, int]:
        async with self.engine.connect() as conn:
            rows = await conn.execute(select(B.status, func.count()).group_by(B.status))
            return {status: count for status, count in rows}


async def _owners(conn: AsyncConnection, ids: set[str]) -> dict[str, tuple[str, str | None]]:
    if not ids:
        return {}
    rows = await conn.execute(select(B.id, B.endpoint, B.key_id).where(B.id.in_(ids)))
    return {row.id: (row.endpoint, row.key_id) for row in rows}


async def _line_counts(conn: AsyncConnection, batch_id: str, live: ColumnElement[bool]) -> dict[str, int]:
    query = select(
        func.count().filter(L.state != "done").label("undone"),
        func.count().filter(live).label("live"),
        func.count().filter((L.state == "done") & (L.status_code < 400)).label("completed"),
        func.count().filter((L.state == "done") & (L.status_code >= 400)).label("failed"),
    ).where(L.batch_id == batch_id)
    return (await conn.execute(query)).one()._asdict()


async def _with_progress(conn: AsyncConnection, batch: dict[str, Any]) -> dict[str, Any]:
    """A running batch's counts read from its lines (an ended batch keeps the counts it ended with)."""
    if batch["status"] in ("in_progress", "cancelling", "finalizing"):
        counts = await _line_counts(conn, batch["id"], L.state == "running")
        batch = batch | {"completed": counts["completed"], "failed": counts["failed"]}
    return batch
