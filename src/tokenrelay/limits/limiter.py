"""Admission against a key's limits: one conditional UPDATE of its counters row, shared by every replica.

Why the database and not Redis: the budget is a prepaid allowance, durable state that must survive
restarts and be settled in the same transaction that writes the request's ledger row, so that a retried
ledger write can never charge twice. Keeping the rate buckets in the same row makes the whole admission one
statement: PostgreSQL locks the row for the UPDATE and re-checks the WHERE clause against the newest
version when replicas race, so concurrent admissions on any number of replicas serialise per key and a
budget cannot be overspent. SQLite (one node) runs the same statement under its database write lock.
Cost: one round trip per request of a limited key; unlimited keys never touch the counters.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from sqlalchemy import Row, delete, insert, select, update
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from tokenrelay.auth.principal import Principal
from tokenrelay.errors import QuotaExceeded, RateLimited
from tokenrelay.limits.buckets import drained, drained_sql, retry_after
from tokenrelay.store.schema import key_counters, reservations
from tokenrelay.store.timeutil import utcnow

c = key_counters.c


@dataclass(frozen=True, slots=True)
class Reservation:
    """What admission took from a key, given back (less the real usage) when the request's row is written."""

    key_id: str
    tokens: int
    tpm: bool  # the tokens went into the tokens-per-minute bucket
    budget_id: str | None  # the reservations row holding budget, if the key has a budget


class Limiter:
    def __init__(self, engine: AsyncEngine) -> None:
        self.engine = engine

    async def admit(self, principal: Principal, cost: int) -> Reservation | None:
        """Reserve one request and `cost` tokens, or raise 429 naming the limit that refused."""
        if not principal.limited or principal.key_id is None:
            return None
        if principal.tpm is not None and cost > principal.tpm:
            raise RateLimited(
                f"This request may use up to {cost} tokens, more than the key's limit of {principal.tpm} tokens "
                "per minute. Lower max_tokens (or n) or shorten the prompt."
            )
        now = time.time()
        budget_id = uuid.uuid4().hex if principal.budget_tokens is not None else None
        async with self.engine.begin() as conn:
            admitted = await self._take(conn, principal, cost, now)
            if admitted and budget_id is not None:
                row = {"id": budget_id, "key_id": principal.key_id, "tokens": cost, "created_at": utcnow()}
                await conn.execute(insert(reservations).values(row))
        if not admitted:
            await self._refuse(principal, cost, now)
        return Reservation(principal.key_id, cost, principal.tpm is not None, budget_id)

    async def _take(self, conn: AsyncConnection, principal: Principal, cost: int, now: float) -> bool:
        conditions: list[Any] = [c.key_id == principal.key_id]
        values: dict[str, Any] = {}
        if principal.rpm is not None:
            level = drained_sql(c.rpm_level, c.rpm_at, principal.rpm, now)
            conditions.append(level + 1 <= principal.rpm)
            values.update(rpm_level=level + 1, rpm_at=now)
        if principal.tpm is not None:
            level = drained_sql(c.tpm_level, c.tpm_at, principal.tpm, now)
            conditions.append(level + cost <= principal.tpm)
            values.update(tpm_level=level + cost, tpm_at=now)
        if principal.budget_tokens is not None:
            conditions.append(c.budget_used + c.budget_reserved + cost <= principal.budget_tokens)
            values.update(budget_reserved=c.budget_reserved + cost)
        result = await conn.execute(update(key_counters).where(*conditions).values(**values).returning(c.key_id))
        return result.first() is not None

    async def _refuse(self, principal: Principal, cost: int, now: float) -> None:
        async with self.engine.connect() as conn:
            row = (await conn.execute(select(key_counters).where(c.key_id == principal.key_id))).first()
        raise refusal(principal, cost, now, row)

    async def release_stale(self, older_than: float) -> int:
        """Give back budget held by reservations older than `older_than` seconds (their replica died)."""
        cutoff = utcnow() - timedelta(seconds=older_than)
        async with self.engine.begin() as conn:
            stale = delete(reservations).where(reservations.c.created_at < cutoff)
            rows = (await conn.execute(stale.returning(reservations.c.key_id, reservations.c.tokens))).all()
            for key_id, tokens in _sum_by_key(rows).items():
                await conn.execute(
                    update(key_counters).where(c.key_id == key_id).values(budget_reserved=c.budget_reserved - tokens)
                )
        return len(rows)

    async def budget_state(self, key_id: str) -> tuple[int, int]:
        """(used, reserved) tokens of a key's budget."""
        query = select(c.budget_used, c.budget_reserved).where(c.key_id == key_id)
        async with self.engine.connect() as conn:
            row = (await conn.execute(query)).one()
        return int(row.budget_used), int(row.budget_reserved)


def refusal(principal: Principal, cost: int, now: float, row: Row[Any] | None) -> Exception:
    """The 429 for a refused admission: the limit with the least room left.

    Read after the refusing UPDATE, so requests settling in between may have made room again; the limit
    closest to full is still the one that refused (and a key with only a budget always gets its quota error).
    """
    if row is None:
        return RateLimited("This key has no limit counters; ask the operator to recreate it.")
    return min(_candidates(principal, cost, now, row), key=lambda pair: pair[0])[1]


def _candidates(principal: Principal, cost: int, now: float, row: Row[Any]) -> list[tuple[float, Exception]]:
    found: list[tuple[float, Exception]] = []
    if principal.budget_tokens is not None:
        left = principal.budget_tokens - row.budget_used - row.budget_reserved
        message = (
            f"This key's token budget is exhausted: the request may use up to {cost} tokens and {max(0, left)} "
            f"remain of {principal.budget_tokens} (tokens held by requests in flight are not available)."
        )
        found.append(((left - cost) / max(principal.budget_tokens, 1), QuotaExceeded(message)))
    if principal.rpm is not None:
        level = drained(row.rpm_level, row.rpm_at, principal.rpm, now)
        wait = retry_after(level, 1, principal.rpm)
        error = _rate_limited(f"Rate limit reached: {principal.rpm} requests per minute.", wait)
        found.append(((principal.rpm - level - 1) / principal.rpm, error))
    if principal.tpm is not None:
        level = drained(row.tpm_level, row.tpm_at, principal.tpm, now)
        wait = retry_after(level, cost, principal.tpm)
        error = _rate_limited(f"Rate limit reached: {principal.tpm} tokens per minute (this request: {cost}).", wait)
        found.append(((principal.tpm - level - cost) / principal.tpm, error))
    return found


def _rate_limited(message: str, wait: int) -> RateLimited:
    return RateLimited(f"{message} Retry after {wait} s.", headers={"Retry-After": str(wait)})


def _sum_by_key(rows: list[Row[Any]]) -> dict[str, int]:
    totals: dict[str, int] = {}
    for key_id, tokens in rows:
        totals[key_id] = totals.get(key_id, 0) + int(tokens)
    return totals
