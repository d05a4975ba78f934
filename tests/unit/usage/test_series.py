"""The pieces of the usage series without a server: bucket windows, nearest-rank percentiles, tallies."""

from __future__ import annotations

from datetime import datetime, timedelta
from types import SimpleNamespace

import pytest

from tokenrelay.usage.tally import Tally, nearest_rank, percentiles
from tokenrelay.usage.window import MAX_BUCKETS, window

NOW = datetime(2026, 3, 10, 14, 37, 12, 345000)


def test_default_windows_end_with_the_current_bucket() -> None:
    hours = window("hour", None, None, NOW)
    assert (hours.start, hours.end, hours.size) == (datetime(2026, 3, 9, 15), datetime(2026, 3, 10, 15), 24)
    days = window("day", None, None, NOW)
    assert (days.start, days.end, days.size) == (datetime(2026, 2, 9), datetime(2026, 3, 11), 30)
    assert days.starts()[:2] == [datetime(2026, 2, 9), datetime(2026, 2, 10)]


def test_explicit_windows_are_aligned_and_index_instants() -> None:
    span = window("hour", datetime(2026, 3, 10, 9, 59), datetime(2026, 3, 10, 11, 0), NOW)
    assert (span.start, span.end, span.size) == (datetime(2026, 3, 10, 9), datetime(2026, 3, 10, 12), 3)
    assert [span.index(datetime(2026, 3, 10, h, 59, 59)) for h in (9, 10, 11)] == [0, 1, 2]


def test_windows_are_bounded() -> None:
    earliest = datetime(2026, 3, 10, 14) - timedelta(hours=MAX_BUCKETS["hour"] - 1)
    assert window("hour", earliest, None, NOW).size == MAX_BUCKETS["hour"] == 14 * 24
    with pytest.raises(ValueError, match="At most 336 buckets"):
        window("hour", earliest - timedelta(minutes=1), None, NOW)
    with pytest.raises(ValueError, match="must not be after"):
        window("day", datetime(2026, 3, 12), datetime(2026, 3, 11), NOW)


def test_nearest_rank_percentiles_are_observed_values() -> None:
    hundred = [float(v) for v in range(100, 0, -1)]
    assert [nearest_rank(sorted(hundred), p) for p in (50, 95, 99)] == [50.0, 95.0, 99.0]
    assert percentiles([30.04, 10.0, 20.0]) == {"p50": 20.0, "p95": 30.0, "p99": 30.0}
    assert percentiles([7.0]) == {"p50": 7.0, "p95": 7.0, "p99": 7.0}
    assert percentiles([]) == {"p50": None, "p95": None, "p99": None}


def _row(
    status: int, latency: float, ttft: float | None = None, tokens: tuple[int, int] = (3, 2), cost: int | None = 5
) -> SimpleNamespace:
    prompt, completion = tokens
    fields = {"prompt_tokens": prompt, "completion_tokens": completion, "cached_tokens": 1}
    fields |= {"cost": cost or 0, "priced": cost is not None}
    return SimpleNamespace(status=status, latency_ms=latency, ttft_ms=ttft, **fields)


def test_tally_counts_failures_but_times_only_answered_requests() -> None:
    tally = Tally(2)
    tally.add(0, _row(200, 100.0, 10.0))
    tally.add(0, _row(429, 1.0, None, (0, 0)))
    tally.add(1, _row(200, 300.0))
    series = tally.to_json()
    assert series["requests"] == [2, 1] and series["failed"] == [1, 0] and series["prompt_tokens"] == [3, 3]
    assert series["latency_ms"]["p50"] == [100.0, 300.0]
    assert series["ttft_ms"]["p99"] == [10.0, None]
    summary = series["summary"]
    assert (summary["requests"], summary["total_tokens"], summary["cached_tokens"]) == (3, 10, 3)
    assert summary["latency_ms"] == {"p50": 100.0, "p95": 300.0, "p99": 300.0}


def test_tally_sums_costs_and_counts_unpriced_rows() -> None:
    tally = Tally(2)
    tally.add(0, _row(200, 1.0, cost=999_999))
    tally.add(0, _row(200, 1.0, cost=1))
    tally.add(1, _row(200, 1.0, cost=None))
    series = tally.to_json()
    assert series["cost_micros"] == [1_000_000, 0] and series["cost"] == ["1.000000", "0.000000"]
    assert series["unpriced_requests"] == [0, 1]
    summary = series["summary"]
    assert (summary["cost"], summary["cost_micros"], summary["unpriced_requests"]) == ("1.000000", 1_000_000, 1)


def test_merged_tallies_have_the_percentiles_of_all_their_rows() -> None:
    one, two = Tally(1), Tally(1)
    for latency in (10.0, 20.0):
        one.add(0, _row(200, latency))
    for latency in (30.0, 40.0, 50.0):
        two.add(0, _row(200, latency))
    one.merge(two)
    assert one.to_json()["latency_ms"]["p50"] == [30.0]
    assert one.weight == (25, 5)
