"""Usage over time: per hour or day, for everything and per key or model, read from the ledger.

Rows are streamed and tallied in Python, the same way on SQLite and PostgreSQL (their percentile and
date-truncation functions differ). The window is bounded (`window.MAX_BUCKETS`), which bounds the scan.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncEngine

from tokenrelay.store.schema import usage
from tokenrelay.store.timeutil import iso
from tokenrelay.usage.report import UsageQuery, conditions
from tokenrelay.usage.tally import Tally
from tokenrelay.usage.window import Window

SeriesBy = Literal["key", "model"]
SERIES_GROUPINGS: tuple[str, ...] = ("key", "model")
DEFAULT_LIMIT = 8  # series beyond the largest few are summed into one "other" series, to keep a chart legible
MAX_LIMIT = 50
FETCH_ROWS = 5_000

u = usage.c
_MEASURED = [
    u.started_at,
    u.status,
    u.prompt_tokens,
    u.completion_tokens,
    u.cached_tokens,
    u.latency_ms,
    u.ttft_ms,
    u.cost,
    u.priced,
]
_LABELS: dict[str, list[Any]] = {"key": [u.key_id, u.key_name], "model": [u.model]}


@dataclass(frozen=True, slots=True)
class SeriesQuery:
    window: Window
    by: SeriesBy | None = None
    key: str | None = None  # key id or name
    model: str | None = None
    limit: int = DEFAULT_LIMIT


def _label(by: SeriesBy, values: tuple[Any, ...]) -> dict[str, Any]:
    return dict(zip(("key_id", "key_name") if by == "key" else ("model",), values, strict=True))


async def _tallies(engine: AsyncEngine, query: SeriesQuery) -> tuple[Tally, dict[tuple[Any, ...], Tally]]:
    window = query.window
    labels = _LABELS[query.by] if query.by else []
    where = conditions(UsageQuery(key=query.key, model=query.model, since=window.start))
    statement = select(*_MEASURED, *labels).where(*where, u.started_at < window.end)
    total = Tally(window.size)
    groups: dict[tuple[Any, ...], Tally] = {}
    async with engine.connect() as conn:
        rows = await conn.stream(statement.execution_options(yield_per=FETCH_ROWS))
        async for row in rows:
            index = window.index(row.started_at)
            total.add(index, row)
            if labels:
                label = tuple(row[len(_MEASURED) :])
                group = groups.get(label)
                if group is None:
                    group = groups[label] = Tally(window.size)
                group.add(index, row)
    return total, groups


async def usage_series(engine: AsyncEngine, query: SeriesQuery, currency: str) -> dict[str, Any]:
    """Figures per bucket and their summary, for everything and per series; costs are in `currency`."""
    total, groups = await _tallies(engine, query)
    ranked = sorted(groups.items(), key=lambda item: item[1].weight, reverse=True)
    shown, rest = ranked[: query.limit], ranked[query.limit :]
    series = [{**_label(query.by, label), **tally.to_json()} for label, tally in shown] if query.by else []
    if rest:
        other = Tally(query.window.size)
        for _, tally in rest:
            other.merge(tally)
        series.append({"other": len(rest), **other.to_json()})
    window = query.window
    return {
        "object": "usage_series",
        "bucket": window.bucket,
        "by": query.by,
        "currency": currency,
        "filters": {"key": query.key, "model": query.model},
        "since": iso(window.start),
        "until": iso(window.end),
        "buckets": [iso(start) for start in window.starts()],
        "total": total.to_json(),
        "series": series,
    }
