"""Settlement: turn reservations into real usage, inside the ledger's write transaction.

Because settlement commits with the ledger rows it belongs to, a row is settled exactly when it is written
the first time; a retried batch whose rows already exist settles nothing again. A request's spend counts in
the budget period its key's counters are in when it settles.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from sqlalchemy import Float, case, delete, literal, update
from sqlalchemy.ext.asyncio import AsyncConnection

from tokenrelay.limits.limiter import Reservation
from tokenrelay.store.schema import key_counters, reservations

c = key_counters.c


@dataclass(frozen=True, slots=True)
class Spent:
    """What a request really used: tokens, and money in micro-units."""

    tokens: int
    micros: int = 0


@dataclass
class KeySettlement:
    used: int = 0  # tokens charged to the budget
    released: int = 0  # reserved budget tokens given back
    cost: int = 0  # micro-units charged to the money budget
    cost_released: int = 0  # reserved micro-units given back
    tpm_refund: int = 0  # tokens taken from the tokens-per-minute bucket but not used


async def settle(conn: AsyncConnection, settled: Iterable[tuple[Reservation, Spent]]) -> None:
    """`settled`: each reservation with what its request really used."""
    settled = list(settled)
    held = await _release(conn, [r.budget_id for r, _ in settled if r.budget_id is not None])
    per_key: dict[str, KeySettlement] = {}
    for reservation, spent in settled:
        entry = per_key.setdefault(reservation.key_id, KeySettlement())
        if reservation.budget_id is not None:
            tokens, micros = held.get(reservation.budget_id, (0, 0))
            entry.used += spent.tokens
            entry.released += tokens
            entry.cost += spent.micros
            entry.cost_released += micros
        if reservation.tpm:
            entry.tpm_refund += reservation.tokens - spent.tokens
    for key_id, entry in per_key.items():
        changes = _changes(entry)
        if changes:
            await conn.execute(update(key_counters).where(c.key_id == key_id).values(**changes))


async def _release(conn: AsyncConnection, ids: list[str]) -> dict[str, tuple[int, int]]:
    """Delete the reservation rows still held; one the stale-reservation sweep already released gives nothing back."""
    if not ids:
        return {}
    r = reservations.c
    query = delete(reservations).where(r.id.in_(ids))
    rows = await conn.execute(query.returning(r.id, r.tokens, r.cost))
    return {row.id: (int(row.tokens), int(row.cost)) for row in rows}


def _changes(entry: KeySettlement) -> dict[str, object]:
    changes: dict[str, object] = {}
    if entry.used or entry.released:
        changes.update(budget_used=c.budget_used + entry.used, budget_reserved=c.budget_reserved - entry.released)
    if entry.cost or entry.cost_released:
        changes.update(cost_used=c.cost_used + entry.cost, cost_reserved=c.cost_reserved - entry.cost_released)
    if entry.tpm_refund:
        level = c.tpm_level - entry.tpm_refund
        changes["tpm_level"] = case((level > 0, level), else_=literal(0.0, Float))
    return changes
