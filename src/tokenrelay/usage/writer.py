"""One ledger batch in one transaction: new rows, their settlement, the keys' last use.

A batch line may run more than once: a run refused for capacity (a rate limit's 429, a full queue's 503) is
put back, as is one cut by a shutdown, and a line whose replica died runs again. Its charge is its latest
run's: when a line's new row is written, the rows of its earlier runs go, and what they took from the key's
budget is given back, so the ledger holds one row per line and the budget pays for one answer.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable

from sqlalchemy import Row, Table, case, delete, literal, select, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from tokenrelay.limits.settle import Spent, settle
from tokenrelay.store.schema import api_keys, key_counters, usage
from tokenrelay.usage.rows import LedgerEntry, last_use

# Each dialect's INSERT, with its ON CONFLICT clauses (the two dialects spell them alike).
_INSERTS: dict[str, Callable[[Table], postgresql.Insert | sqlite.Insert]] = {
    "postgresql": postgresql.insert,
    "sqlite": sqlite.insert,
}


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
        await settle(conn, [(e.reservation, Spent(e.tokens, e.cost)) for e in fresh if e.reservation is not None])
        await _keep_latest_runs(conn, {e.values["request_id"] for e in fresh if e.batch_line})
        await _touch_keys(conn, fresh)
    return len(fresh)


def _insert(conn: AsyncConnection) -> postgresql.Insert | sqlite.Insert:
    return _INSERTS[conn.dialect.name](usage).on_conflict_do_nothing(index_elements=["id"])


async def _insert_new(conn: AsyncConnection, entries: list[LedgerEntry]) -> set[str]:
    result = await conn.execute(_insert(conn).returning(usage.c.id), [e.values for e in entries])
    return set(result.scalars())


async def _keep_latest_runs(conn: AsyncConnection, request_ids: set[str]) -> None:
    """Of each batch line's rows, keep the latest run's (by its end: a run's row replayed late from a spill
    file loses to a newer run's) and give the others' tokens back to their keys' budgets."""
    if not request_ids:
        return
    c = usage.c
    tokens = (c.prompt_tokens + c.completion_tokens).label("tokens")
    query = select(c.id, c.request_id, c.key_id, tokens, c.cost, c.ended_at).where(
        c.request_id.in_(request_ids), c.batch_id.is_not(None)
    )
    rows = (await conn.execute(query)).all()
    latest = {}
    for row in sorted(rows, key=lambda row: (row.ended_at, row.id)):
        latest[row.request_id] = row.id
    earlier = [row for row in rows if latest[row.request_id] != row.id]
    if not earlier:
        return
    await conn.execute(delete(usage).where(c.id.in_([row.id for row in earlier])))
    refunds: dict[str, list[Row]] = defaultdict(list)
    for row in earlier:
        if row.key_id is not None:
            refunds[row.key_id].append(row)
    for key_id, runs in refunds.items():
        await _refund(conn, key_id, runs)


async def _refund(conn: AsyncConnection, key_id: str, runs: list[Row]) -> None:
    """Give back what earlier runs charged, those that ended in the key's current budget period (a spend counted
    in a period that has since ended is already gone). The counts stay at least 0: a key given its budget after
    the earlier run was never charged for it."""
    k = key_counters.c
    start = (await conn.execute(select(k.period_start).where(k.key_id == key_id))).scalar()
    counted = [run for run in runs if start is None or run.ended_at >= start]
    if not counted:
        return
    tokens, micros = sum(run.tokens for run in counted), sum(run.cost for run in counted)
    kept = {
        "budget_used": case((k.budget_used - tokens > 0, k.budget_used - tokens), else_=literal(0)),
        "cost_used": case((k.cost_used - micros > 0, k.cost_used - micros), else_=literal(0)),
    }
    await conn.execute(update(key_counters).where(k.key_id == key_id).values(**kept))


async def _touch_keys(conn: AsyncConnection, entries: list[LedgerEntry]) -> None:
    for key_id, when in last_use(entries).items():
        stale = api_keys.c.last_used_at.is_(None) | (api_keys.c.last_used_at < when)
        await conn.execute(update(api_keys).where(api_keys.c.id == key_id, stale).values(last_used_at=when))
