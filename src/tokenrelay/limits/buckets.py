"""Leaky buckets for "N per minute": a level that drains at N/60 per second and may not exceed N.

The same arithmetic runs in SQL (to decide atomically) and in Python (to explain a refusal), so it lives
in one place. A bucket allows a burst of N at once and then N per minute, the usual reading of a
per-minute limit, without the doubled bursts of fixed windows at minute boundaries.
"""

from __future__ import annotations

import math
from typing import Any

from sqlalchemy import Float, case, literal


def drained_sql(level: Any, at: Any, per_minute: int, now: float) -> Any:
    """SQL: the bucket's level at `now` (never below zero)."""
    drained = level - (literal(now, Float) - at) * (per_minute / 60.0)
    return case((drained > 0, drained), else_=literal(0.0, Float))


def drained(level: float, at: float, per_minute: int, now: float) -> float:
    return max(0.0, level - (now - at) * per_minute / 60.0)


def retry_after(level: float, cost: float, per_minute: int) -> int:
    """Whole seconds until `cost` more fits under the limit."""
    overflow = level + cost - per_minute
    return max(1, math.ceil(overflow * 60.0 / per_minute))
