"""Per-bucket figures of one series (a key, a model, everything), with exact latency percentiles and costs
(the integer micro-units each row was charged, summed exactly)."""

from __future__ import annotations

import math
from array import array
from collections.abc import Sequence
from typing import Any

from tokenrelay.pricing.cost import money
from tokenrelay.usage.costs import cost_figures

COUNTS = (
    "requests",
    "prompt_tokens",
    "completion_tokens",
    "cached_tokens",
    "failed",
    "cost_micros",
    "unpriced_requests",
)
PERCENTILES = (50, 95, 99)
TIMINGS = ("latency_ms", "ttft_ms")


def nearest_rank(ordered: Sequence[float], percentile: float) -> float | None:
    """The nearest-rank percentile of sorted values: always a value that was observed, None when there is none."""
    if not ordered:
        return None
    rank = max(1, math.ceil(percentile / 100 * len(ordered)))
    return ordered[rank - 1]


def percentiles(values: Sequence[float]) -> dict[str, float | None]:
    ordered = sorted(values)
    found = {f"p{p}": nearest_rank(ordered, p) for p in PERCENTILES}
    return {name: None if v is None else round(v, 1) for name, v in found.items()}


class Tally:
    """Counts per bucket, and every timing per bucket (as compact float arrays) for the percentiles.

    Timings are those of answered requests (status < 400): a refusal's few milliseconds would pull the
    percentiles down exactly when something goes wrong.
    """

    def __init__(self, size: int) -> None:
        self.counts = {name: [0] * size for name in COUNTS}
        self.timings: dict[str, list[array[float]]] = {name: [array("d") for _ in range(size)] for name in TIMINGS}

    def add(self, index: int, row: Any) -> None:
        counts = self.counts
        counts["requests"][index] += 1
        counts["prompt_tokens"][index] += row.prompt_tokens
        counts["completion_tokens"][index] += row.completion_tokens
        counts["cached_tokens"][index] += row.cached_tokens
        counts["cost_micros"][index] += row.cost
        if not row.priced:
            counts["unpriced_requests"][index] += 1
        if row.status >= 400:
            counts["failed"][index] += 1
            return
        self.timings["latency_ms"][index].append(row.latency_ms)
        if row.ttft_ms is not None:
            self.timings["ttft_ms"][index].append(row.ttft_ms)

    def merge(self, other: Tally) -> None:
        for name, values in self.counts.items():
            for i, value in enumerate(other.counts[name]):
                values[i] += value
        for name, buckets in self.timings.items():
            for mine, theirs in zip(buckets, other.timings[name], strict=True):
                mine.extend(theirs)

    @property
    def weight(self) -> tuple[int, int]:
        """What ranks series for display: tokens, then requests."""
        tokens = sum(self.counts["prompt_tokens"]) + sum(self.counts["completion_tokens"])
        return tokens, sum(self.counts["requests"])

    def to_json(self) -> dict[str, Any]:
        series: dict[str, Any] = dict(self.counts)
        series["cost"] = [money(micros) for micros in self.counts["cost_micros"]]
        for name, buckets in self.timings.items():
            per_bucket = [percentiles(values) for values in buckets]
            series[name] = {f"p{p}": [b[f"p{p}"] for b in per_bucket] for p in PERCENTILES}
        summary: dict[str, Any] = {name: sum(values) for name, values in self.counts.items()}
        summary["total_tokens"] = summary["prompt_tokens"] + summary["completion_tokens"]
        summary.update(cost_figures(summary["cost_micros"]))
        for name, buckets in self.timings.items():
            summary[name] = percentiles([value for values in buckets for value in values])
        series["summary"] = summary
        return series
