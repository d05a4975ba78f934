"""UTC timestamps as the database stores them (naive UTC), and the `--expires` / `--since` formats."""

from __future__ import annotations

import re
from datetime import UTC, date, datetime, timedelta

DURATION_PATTERN = r"^\s*([0-9]+)\s*([smhdw])\s*$"
_DURATION = re.compile(DURATION_PATTERN)
_UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days", "w": "weeks"}


def utcnow() -> datetime:
    return datetime.now(UTC).replace(tzinfo=None)


def as_naive_utc(value: datetime) -> datetime:
    return value if value.tzinfo is None else value.astimezone(UTC).replace(tzinfo=None)


def parse_instant(text: str) -> datetime:
    """`2026-01-01` or an ISO 8601 date-time (naive means UTC)."""
    text = text.strip()
    try:
        if len(text) == 10:
            return datetime.combine(date.fromisoformat(text), datetime.min.time())
        return as_naive_utc(datetime.fromisoformat(text))
    except ValueError:
        raise ValueError(f"{text!r} is not a date (2026-01-31) or an ISO 8601 date-time") from None


def parse_expiry(text: str, now: datetime | None = None) -> datetime:
    """`30d`, `12h`, `2w`, `90m`, `45s` from now, or an absolute date / date-time.

    Written here because the whole grammar is one regex; the duration libraries parse far more than this.
    """
    match = _DURATION.match(text)
    if match is None:
        return parse_instant(text)
    amount, unit = int(match.group(1)), _UNITS[match.group(2)]
    try:
        return (now or utcnow()) + timedelta(**{unit: amount})
    except OverflowError:
        raise ValueError(f"{text!r} ends after the year 9999") from None


def iso(value: datetime | None) -> str | None:
    return None if value is None else value.replace(microsecond=0).isoformat() + "Z"
