"""Settlement: turn reservations into real usage, inside the ledger's write transaction.

Because settlement commits with the ledger rows it belongs to, a row is settled exactly when it is written
the first time; a retried batch whose rows already exist settles nothing again.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from sqlalchemy import Float, case, delete, literal, update
from sqlalchemy.ext.asyncio import AsyncConnection

from tokenrelay.limits.limiter import Reservation
from tokenrelay.store.schema import key_counters, reservations

c = key_counters.c


@dataclass
class KeySettlement:
    used: int = 0  # tokens charged to the budget
    released: int = 0  # reserved budget tokens given back
    tpm_refund: int = 0  # tokens taken from the tokens-per-minute bucket but not used


async def settle(conn: AsyncConnection, settled: Iterable[tuple[Reservation, int]]) -> None:
    """`settled`: each reservation with the tokens its request really used."""
    settled = list(settled)
    held = await _release(conn, [r.budget_id for r, _ in settled if r.budget_id is not None])
    per_key: dict[str, KeySettlement] = {}
    for reservation, used in settled:
        entry = per_key.setdefault(reservation.key_id, KeySettlement())
        if reservation.budget_id is not None:
            entry.used += used
            entry.released += held.get(reservation.budget_id, 0)
        if reservation.tpm:
            entry.tpm_refund += reservation.tokens - used
    for key_id, entry in per_key.items():
        changes = _changes(entry)
        if changes:
            await conn.execute(update(key_counters).where(c.key_id == key_id).values(**changes))


async def _release(conn: AsyncConnection, ids: list[str]) -> dict[str, int]:
    """Delete the reservation rows still held; one the stale-reservation sweep already released gives nothing back."""
    if not ids:
        return {}
    query = delete(reservations).where(reservations.c.id.in_(ids))
    rows = await conn.execute(query.returning(reservations.c.id, reservations.c.tokens))
    return {row.id: int(row.tokens) for row in rows}


def _changes(entry: KeySettlement) -> dict[str, object]:
    changes: dict[str, object] = {}
    if entry.used or entry.released:
        changes.update(budget_used=c.budget_used + entry.used, budget_reserved=c.budget_reserved - entry.released)
    if entry.tpm_refund:
        level = c.tpm_level - entry.tpm_refund
        changes["tpm_level"] = case((level > 0, level), else_=literal(0.0, Float))
    return changes
