"""Batch API state read at scrape time: batches by state (as the database holds them, read by the batch
runner at its last step) and the lines this process has answered."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector


@dataclass(frozen=True, slots=True)
class BatchProgress:
    states: Mapping[str, int]
    lines_done: int


class BatchCollector(Collector):
    def __init__(self, progress: Callable[[], BatchProgress]) -> None:
        self.progress = progress

    def collect(self) -> Iterator[Metric]:
        progress = self.progress()
        batches = GaugeMetricFamily("tokenrelay_batches", "Batches by state (all replicas).", labels=["state"])
        for state, count in sorted(progress.states.items()):
            batches.add_metric([state], count)
        yield batches
        lines = CounterMetricFamily("tokenrelay_batch_lines", "Batch lines this process answered.")
        lines.add_metric([], progress.lines_done)
        yield lines
