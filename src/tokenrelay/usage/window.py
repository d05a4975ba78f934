"""The time window of a usage series: aligned hour or day buckets, bounded in number."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Literal

Bucket = Literal["hour", "day"]
BUCKETS: tuple[str, ...] = ("hour", "day")

STEP: dict[str, timedelta] = {"hour": timedelta(hours=1), "day": timedelta(days=1)}
DEFAULT_SPAN: dict[str, int] = {"hour": 24, "day": 30}  # buckets shown when no `since` is given
# Percentiles are computed over every row of the window, so the window is bounded: 14 days by hour, a year by day.
MAX_BUCKETS: dict[str, int] = {"hour": 14 * 24, "day": 366}


def floor(instant: datetime, bucket: Bucket) -> datetime:
    start = instant.replace(minute=0, second=0, microsecond=0)
    return start.replace(hour=0) if bucket == "day" else start


@dataclass(frozen=True, slots=True)
class Window:
    """Buckets `[start, end)` of naive UTC times, `start` and `end` on bucket boundaries."""

    bucket: Bucket
    start: datetime
    end: datetime

    @property
    def size(self) -> int:
        return int((self.end - self.start) / STEP[self.bucket])

    def starts(self) -> list[datetime]:
        return [self.start + i * STEP[self.bucket] for i in range(self.size)]

    def index(self, instant: datetime) -> int:
        return int((instant - self.start) / STEP[self.bucket])


def window(bucket: Bucket, since: datetime | None, until: datetime | None, now: datetime) -> Window:
    """The buckets holding `since` through `until` (default: now, and the default span before it).

    Raises ValueError for an empty or reversed window, or one of more than `MAX_BUCKETS` buckets.
    """
    step = STEP[bucket]
    last = floor(until if until is not None else now, bucket)
    first = floor(since, bucket) if since is not None else last - (DEFAULT_SPAN[bucket] - 1) * step
    if first > last:
        raise ValueError("`since` must not be after `until`.")
    result = Window(bucket, first, last + step)
    if result.size > MAX_BUCKETS[bucket]:
        raise ValueError(f"At most {MAX_BUCKETS[bucket]} buckets of one {bucket}; narrow `since` / `until`.")
    return result
