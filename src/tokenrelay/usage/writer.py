"""One ledger batch in one transaction: new rows, their settlement, the keys' last use."""

from __future__ import annotations

from sqlalchemy import Insert, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from tokenrelay.limits.settle import settle
from tokenrelay.store.schema import api_keys, usage
from tokenrelay.usage.rows import LedgerEntry, last_use

_INSERTS = {"postgresql": postgresql.insert, "sqlite": sqlite.insert}


async def write_batch(engine: AsyncEngine, entries: list[LedgerEntry], *, maybe_written: bool = True) -> int:
    """Write the entries not written before (by id); returns how many were new.

    `maybe_written=False` is for a batch never tried before, whose rows cannot exist yet (their ids are
    new): the insert then asks nothing back, which saves the database returning a row per row (and, with
    SQLite, the driver's thread taking the GIL back once per row). A batch being retried, or replayed from a
    spill file, may have been committed already, so it asks which of its rows are new."""
    async with engine.begin() as conn:
        if maybe_written:
            new = await _insert_new(conn, entries)
            fresh = [e for e in entries if e.id in new]
        else:
            await conn.execute(_insert(conn), [e.values for e in entries])
            fresh = entries
        await settle(conn, [(e.reservation, e.tokens) for e in fresh if e.reservation is not None])
        await _touch_keys(conn, fresh)
    return len(fresh)


def _insert(conn: AsyncConnection) -> Insert:
    return _INSERTS[conn.dialect.name](usage).on_conflict_do_nothing(index_elements=["id"])


async def _insert_new(conn: AsyncConnection, entries: list[LedgerEntry]) -> set[str]:
    result = await conn.execute(_insert(conn).returning(usage.c.id), [e.values for e in entries])
    return set(result.scalars())


async def _touch_keys(conn: AsyncConnection, entries: list[LedgerEntry]) -> None:
    for key_id, when in last_use(entries).items():
        stale = api_keys.c.last_used_at.is_(None) | (api_keys.c.last_used_at < when)
        await conn.execute(update(api_keys).where(api_keys.c.id == key_id, stale).values(last_used_at=when))
