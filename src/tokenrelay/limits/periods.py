"""Budget periods: UTC calendar days, ISO weeks (from Monday) and months; `total` never resets."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Literal, get_args

Period = Literal["total", "daily", "weekly", "monthly"]
PERIODS: tuple[str, ...] = get_args(Period)


def period_start(period: str, now: datetime) -> datetime | None:
    """The start of the period `now` (naive UTC) falls in; None for `total`."""
    day = now.replace(hour=0, minute=0, second=0, microsecond=0)
    if period == "daily":
        return day
    if period == "weekly":
        return day - timedelta(days=day.weekday())
    if period == "monthly":
        return day.replace(day=1)
    return None


def next_reset(period: str, now: datetime) -> datetime | None:
    """When the period `now` falls in ends and a budget's spend starts from zero again; None for `total`."""
    start = period_start(period, now)
    if start is None:
        return None
    if period == "daily":
        return start + timedelta(days=1)
    if period == "weekly":
        return start + timedelta(weeks=1)
    return start.replace(year=start.year + 1, month=1) if start.month == 12 else start.replace(month=start.month + 1)
