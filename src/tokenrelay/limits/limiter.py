"""Admission against a key's limits: one conditional UPDATE of its counters row, shared by every replica.

Why the database and not Redis: the budget is a prepaid allowance, durable state that must survive
restarts and be settled in the same transaction that writes the request's ledger row, so that a retried
ledger write can never charge twice. Keeping the rate buckets in the same row makes the whole admission one
statement: PostgreSQL locks the row for the UPDATE and re-checks the WHERE clause against the newest
version when replicas race, so concurrent admissions on any number of replicas serialise per key and a
budget cannot be overspent. SQLite (one node) runs the same statement under its database write lock.
Cost: one round trip per request of a limited key; unlimited keys never touch the counters.

With `redis_url` set, the rate buckets live in Redis instead (`limits/rates.py`) and the row keeps the budgets:
the buckets are taken first, then the budget, and a budget's refusal gives the buckets' take back.

Budgets are in tokens, in money (micro-units), or both, over a period (`limits/periods.py`): the first
admission of a new period starts the spend from zero in the same statement, so replicas racing across a
period boundary still see one count.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import ColumnElement, Row, case, delete, insert, literal, select, update
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from tokenrelay.errors import QuotaExceeded, RateLimited
from tokenrelay.limits.buckets import drained, drained_sql, retry_after
from tokenrelay.limits.cost import Charge
from tokenrelay.limits.periods import next_reset, period_start
from tokenrelay.limits.rates import Levels, RateAsk, RateBuckets
from tokenrelay.pricing.cost import money
from tokenrelay.principal import Principal
from tokenrelay.store.schema import key_counters, reservations
from tokenrelay.store.timeutil import iso, utcnow

c = key_counters.c


@dataclass(frozen=True, slots=True)
class Reservation:
    """What admission took from a key, given back (less the real usage) when the request's row is written."""

    key_id: str
    tokens: int
    tpm: bool  # the tokens went into the tokens-per-minute bucket
    budget_id: str | None  # the reservations row holding budget, if the key has a budget
    micros: int = 0  # money held against the key's money budget
    rate_tokens: int = 0  # tokens taken from a tokens-per-minute bucket outside the database (`limits/rates.py`)


class Limiter:
    def __init__(
        self, engine: AsyncEngine, clock: Callable[[], datetime] = utcnow, rates: RateBuckets | None = None
    ) -> None:
        self.engine = engine
        self.clock = clock  # naive UTC now: which budget period an admission falls in
        self.rates = rates  # where rpm/tpm buckets live when not in the key's counters row (Redis)
        self._refunds: set[asyncio.Task[None]] = set()

    async def admit(self, principal: Principal, charge: Charge, currency: str = "") -> Reservation | None:
        """Reserve one request and `charge` (tokens and money), or raise 429 naming the limit that refused."""
        if not principal.limited or principal.key_id is None:
            return None
        if principal.tpm is not None and charge.tokens > principal.tpm:
            raise RateLimited(
                f"This request may use up to {charge.tokens} tokens, more than the key's limit of {principal.tpm} "
                "tokens per minute. Lower max_tokens (or n) or shorten the prompt."
            )
        if self.rates is not None and (principal.rpm is not None or principal.tpm is not None):
            return await self._admit_with_rates(self.rates, principal, principal.key_id, charge, currency)
        return await self._admit_in_database(principal, principal.key_id, charge, currency)

    async def _admit_with_rates(
        self, rates: RateBuckets, principal: Principal, key_id: str, charge: Charge, currency: str
    ) -> Reservation:
        """The rate buckets from `rates`, then the budgets (if any) from the counters row."""
        ask = RateAsk(key_id, principal.rpm, principal.tpm, charge.tokens if principal.tpm is not None else 0)
        levels = await rates.take(ask)
        if levels is not None:
            rates_only = replace(principal, budget_tokens=None, budget_cost=None)
            raise refusal(Asked(rates_only, charge, levels.at, self.clock(), currency), levels)
        budgets = replace(principal, rpm=None, tpm=None)
        if not budgets.budgeted:
            return Reservation(key_id, charge.tokens, False, None, charge.micros, rate_tokens=ask.tokens)
        try:
            reservation = await self._admit_in_database(budgets, key_id, charge, currency)
        except BaseException:  # refused (or failed, or cancelled): the request never runs
            await rates.give_back(key_id, 1 if ask.rpm is not None else 0, ask.tokens)
            raise
        return replace(reservation, rate_tokens=ask.tokens)

    def give_back_rates(self, reservation: Reservation, used_tokens: int) -> None:
        """Give the tokens-per-minute bucket outside the database what the request did not use. Not durable
        state, so it need not wait for the ledger row as the database's bucket does (`limits/settle.py`)."""
        unused = reservation.rate_tokens - used_tokens
        if self.rates is None or not reservation.rate_tokens or not unused:
            return
        task = asyncio.get_running_loop().create_task(self.rates.give_back(reservation.key_id, 0, unused))
        self._refunds.add(task)  # held until done, so the loop does not drop it
        task.add_done_callback(self._refunds.discard)

    async def close(self) -> None:
        if self.rates is None:
            return
        await asyncio.gather(*self._refunds, return_exceptions=True)
        await self.rates.close()

    async def _admit_in_database(self, principal: Principal, key_id: str, charge: Charge, currency: str) -> Reservation:
        now, today = time.time(), self.clock()
        budget_id = uuid.uuid4().hex if principal.budgeted else None
        async with self.engine.begin() as conn:
            admitted = await self._take(conn, principal, charge, now, today)
            if admitted and budget_id is not None:
                row = {
                    "id": budget_id,
                    "key_id": principal.key_id,
                    "tokens": charge.tokens,
                    "cost": charge.micros,
                    "created_at": today,
                }
                await conn.execute(insert(reservations).values(row))
        if not admitted:
            await self._refuse(principal, charge, now, today, currency)
        return Reservation(key_id, charge.tokens, principal.tpm is not None, budget_id, charge.micros)

    async def _take(
        self, conn: AsyncConnection, principal: Principal, charge: Charge, now: float, today: datetime
    ) -> bool:
        conditions: list[Any] = [c.key_id == principal.key_id]
        values: dict[str, Any] = {}
        if principal.rpm is not None:
            level = drained_sql(c.rpm_level, c.rpm_at, principal.rpm, now)
            conditions.append(level + 1 <= principal.rpm)
            values.update(rpm_level=level + 1, rpm_at=now)
        if principal.tpm is not None:
            level = drained_sql(c.tpm_level, c.tpm_at, principal.tpm, now)
            conditions.append(level + charge.tokens <= principal.tpm)
            values.update(tpm_level=level + charge.tokens, tpm_at=now)
        if principal.budgeted:
            tokens_used: ColumnElement[Any] = c.budget_used
            cost_used: ColumnElement[Any] = c.cost_used
            start = period_start(principal.budget_period, today)
            if start is not None:  # a new period's first admission starts the spend from zero
                fresh = c.period_start.is_(None) | (c.period_start < start)
                tokens_used = case((fresh, literal(0)), else_=c.budget_used)
                cost_used = case((fresh, literal(0)), else_=c.cost_used)
                values.update(budget_used=tokens_used, cost_used=cost_used, period_start=start)
            if principal.budget_tokens is not None:
                conditions.append(tokens_used + c.budget_reserved + charge.tokens <= principal.budget_tokens)
            if principal.budget_cost is not None:
                conditions.append(cost_used + c.cost_reserved + charge.micros <= principal.budget_cost)
            values.update(
                budget_reserved=c.budget_reserved + charge.tokens, cost_reserved=c.cost_reserved + charge.micros
            )
        result = await conn.execute(update(key_counters).where(*conditions).values(**values).returning(c.key_id))
        return result.first() is not None

    async def _refuse(self, principal: Principal, charge: Charge, now: float, today: datetime, currency: str) -> None:
        async with self.engine.connect() as conn:
            row = (await conn.execute(select(key_counters).where(c.key_id == principal.key_id))).first()
        raise refusal(Asked(principal, charge, now, today, currency), row)

    async def release_stale(self, older_than: float) -> int:
        """Give back budget held by reservations older than `older_than` seconds (their replica died)."""
        cutoff = utcnow() - timedelta(seconds=older_than)
        r = reservations.c
        async with self.engine.begin() as conn:
            stale = delete(reservations).where(r.created_at < cutoff)
            rows = (await conn.execute(stale.returning(r.key_id, r.tokens, r.cost))).all()
            for key_id, (tokens, micros) in _sum_by_key(rows).items():
                held = {"budget_reserved": c.budget_reserved - tokens, "cost_reserved": c.cost_reserved - micros}
                await conn.execute(update(key_counters).where(c.key_id == key_id).values(**held))
        return len(rows)

    async def budget_state(self, key_id: str) -> BudgetState:
        """What a key's budgets hold now (spend as counted since its period began, and in flight)."""
        query = select(c.budget_used, c.budget_reserved, c.cost_used, c.cost_reserved).where(c.key_id == key_id)
        async with self.engine.connect() as conn:
            row = (await conn.execute(query)).one()
        return BudgetState(int(row.budget_used), int(row.budget_reserved), int(row.cost_used), int(row.cost_reserved))


@dataclass(frozen=True, slots=True)
class BudgetState:
    tokens_used: int
    tokens_reserved: int
    cost_used: int = 0
    cost_reserved: int = 0


@dataclass(frozen=True, slots=True)
class Asked:
    """A refused admission: who asked for how much, when."""

    principal: Principal
    charge: Charge
    now: float  # epoch seconds (the rate buckets')
    today: datetime  # naive UTC (the budget period's)
    currency: str


def period_spend(principal: Principal, row: Row, today: datetime) -> tuple[int, int]:
    """(tokens, micro-units) the key has spent in the current period, as its counters row says."""
    start = period_start(principal.budget_period, today)
    if start is not None and (row.period_start is None or row.period_start < start):
        return 0, 0  # the period began since the last admission
    return int(row.budget_used), int(row.cost_used)


def refusal(asked: Asked, row: Row | Levels | None) -> Exception:
    """The 429 for a refused admission: the limit with the least room left.

    Read after the refusing UPDATE, so requests settling in between may have made room again; the limit
    closest to full is still the one that refused (and a key with only a budget always gets its quota error).
    """
    if row is None:
        return RateLimited("This key has no limit counters; ask the operator to recreate it.")
    return min(_candidates(asked, row), key=lambda pair: pair[0])[1]


def _candidates(asked: Asked, row: Row | Levels) -> list[tuple[float, Exception]]:
    principal, charge, now = asked.principal, asked.charge, asked.now
    found = [] if isinstance(row, Levels) else _budget_candidates(asked, row)  # Redis's buckets hold no budgets
    if principal.rpm is not None:
        level = drained(row.rpm_level, row.rpm_at, principal.rpm, now)
        wait = retry_after(level, 1, principal.rpm)
        error = _rate_limited(f"Rate limit reached: {principal.rpm} requests per minute.", wait)
        found.append(((principal.rpm - level - 1) / principal.rpm, error))
    if principal.tpm is not None:
        level = drained(row.tpm_level, row.tpm_at, principal.tpm, now)
        wait = retry_after(level, charge.tokens, principal.tpm)
        message = f"Rate limit reached: {principal.tpm} tokens per minute (this request: {charge.tokens})."
        found.append(((principal.tpm - level - charge.tokens) / principal.tpm, _rate_limited(message, wait)))
    return found


def _budget_candidates(asked: Asked, row: Row) -> list[tuple[float, Exception]]:
    principal, charge = asked.principal, asked.charge
    tokens_used, cost_used = period_spend(principal, row, asked.today)
    period = "" if principal.budget_period == "total" else f"{principal.budget_period} "
    reset = next_reset(principal.budget_period, asked.today)
    resets = f" It resets at {iso(reset)}." if reset is not None else ""
    in_flight = "(what requests in flight hold is not available)"
    found: list[tuple[float, Exception]] = []
    if principal.budget_tokens is not None:
        left = principal.budget_tokens - tokens_used - row.budget_reserved
        message = (
            f"This key's {period}token budget is exhausted: the request may use up to {charge.tokens} tokens and "
            f"{max(0, left)} remain of {principal.budget_tokens} {in_flight}.{resets}"
        )
        found.append(((left - charge.tokens) / max(principal.budget_tokens, 1), QuotaExceeded(message)))
    if principal.budget_cost is not None:
        left = principal.budget_cost - cost_used - row.cost_reserved
        unit = f" {asked.currency}" if asked.currency else ""
        message = (
            f"This key's {period}budget of {money(principal.budget_cost)}{unit} is exhausted: the request may cost "
            f"up to {money(charge.micros)}{unit} and {money(max(0, left))}{unit} remain {in_flight}.{resets}"
        )
        found.append(((left - charge.micros) / max(principal.budget_cost, 1), QuotaExceeded(message)))
    return found


def _rate_limited(message: str, wait: int) -> RateLimited:
    return RateLimited(f"{message} Retry after {wait} s.", headers={"Retry-After": str(wait)})


def _sum_by_key(rows: Sequence[Row]) -> dict[str, tuple[int, int]]:
    totals: dict[str, tuple[int, int]] = {}
    for key_id, tokens, micros in rows:
        held = totals.get(key_id, (0, 0))
        totals[key_id] = (held[0] + int(tokens), held[1] + int(micros))
    return totals
