"""Usage totals over the ledger, optionally filtered and grouped: what `tokenrelay usage` and
`GET /admin/usage` both serve.

Costs are summed in SQL as the integer micro-units each row was charged, so a total is exact and does not move
when prices change later; `unpriced_requests` counts rows of models without prices (they cost 0).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

from sqlalchemy import ColumnElement, Integer, Row, case, func, select
from sqlalchemy.ext.asyncio import AsyncEngine

from tokenrelay.store.schema import usage
from tokenrelay.store.timeutil import iso
from tokenrelay.usage.costs import cost_figures

GroupBy = Literal["key", "model", "day"]
GROUPINGS: tuple[str, ...] = ("key", "model", "day")

u = usage.c


@dataclass(frozen=True, slots=True)
class UsageQuery:
    key: str | None = None  # key id or name
    model: str | None = None
    since: datetime | None = None  # naive UTC, inclusive
    by: GroupBy | None = None

    def filters(self) -> dict[str, Any]:
        return {"key": self.key, "model": self.model, "since": iso(self.since), "by": self.by}


def _measures() -> list[Any]:
    return [
        func.count().label("requests"),
        func.coalesce(func.sum(u.prompt_tokens), 0).label("prompt_tokens"),
        func.coalesce(func.sum(u.completion_tokens), 0).label("completion_tokens"),
        func.coalesce(func.sum(u.cached_tokens), 0).label("cached_tokens"),
        func.coalesce(func.sum(u.cost), 0).label("cost_micros"),
        func.coalesce(func.sum(case((u.priced, 0), else_=1).cast(Integer)), 0).label("unpriced_requests"),
        func.coalesce(func.sum(case((u.status >= 400, 1), else_=0).cast(Integer)), 0).label("failed"),
        func.coalesce(func.sum(case((u.cancelled, 1), else_=0).cast(Integer)), 0).label("cancelled"),
    ]


def _groups(by: GroupBy | None) -> list[Any]:
    if by == "key":
        return [u.key_id, u.key_name]
    if by == "model":
        return [u.model]
    if by == "day":
        return [func.date(u.started_at).label("day")]  # date() exists in SQLite and PostgreSQL alike
    return []


def conditions(query: UsageQuery) -> list[ColumnElement[bool]]:
    """The ledger rows a query covers (also what the usage series filter by)."""
    found: list[ColumnElement[bool]] = []
    if query.key is not None:
        found.append((u.key_id == query.key) | (u.key_name == query.key))
    if query.model is not None:
        found.append(u.model == query.model)
    if query.since is not None:
        found.append(u.started_at >= query.since)
    return found


def _figures(row: Any) -> dict[str, Any]:
    figures = {name: int(getattr(row, name)) for name in ("requests", "prompt_tokens", "completion_tokens")}
    figures["total_tokens"] = figures["prompt_tokens"] + figures["completion_tokens"]
    figures.update({name: int(getattr(row, name)) for name in ("cached_tokens", "failed", "cancelled")})
    figures.update(cost_figures(int(row.cost_micros)))  # PostgreSQL sums a bigint as a numeric
    figures["unpriced_requests"] = int(row.unpriced_requests)
    return figures


def _label(row: Any, by: GroupBy) -> dict[str, Any]:
    if by == "key":
        return {"key_id": row.key_id, "key_name": row.key_name}
    if by == "model":
        return {"model": row.model}
    return {"day": str(row.day)}


async def usage_report(engine: AsyncEngine, query: UsageQuery, currency: str) -> dict[str, Any]:
    """Totals (and groups) of the rows the query covers; costs are in `currency`, the settings' one."""
    keys = _groups(query.by)
    where = conditions(query)
    async with engine.connect() as conn:
        total = (await conn.execute(select(*_measures()).where(*where))).one()
        rows: Sequence[Row] = []
        if keys:
            grouped = select(*keys, *_measures()).where(*where).group_by(*keys).order_by(*keys)
            rows = (await conn.execute(grouped)).all()
    groups = [{**_label(row, query.by), **_figures(row)} for row in rows] if query.by else []
    return {
        "object": "usage_report",
        "currency": currency,
        "filters": query.filters(),
        "totals": _figures(total),
        "groups": groups,
    }
