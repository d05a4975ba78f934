"""Prometheus metrics of one app: its own registry (never the process-global one), built with the app.

With several workers, `/metrics` shows the request metrics of all of them (`metrics.multiprocess`); backend
state is read at scrape time from the worker that answers.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Info, generate_latest

from tokenrelay import __version__
from tokenrelay.calls.record import Call
from tokenrelay.observability.metrics.backends import BackendCollector, BackendStatus
from tokenrelay.observability.metrics.batches import BatchCollector, BatchProgress
from tokenrelay.observability.metrics.multiprocess import merged_registry, worker_exited
from tokenrelay.observability.metrics.requests import RequestMetrics

__all__ = ["CONTENT_TYPE_LATEST", "Metrics"]


class Metrics:
    """Everything `/metrics` shows: request metrics fed by finished calls, backend state read at scrape time."""

    def __init__(
        self,
        statuses: Callable[[], Iterable[BackendStatus]],
        batches: Callable[[], BatchProgress],
        shared_dir: Path | None = None,
    ) -> None:
        """`shared_dir`: the multiprocess directory of several workers, whose request metrics are summed."""
        self.shared_dir = shared_dir
        self.registry = CollectorRegistry()
        self.requests = RequestMetrics(self.registry)
        # What a scrape reads: this registry, or every worker's files (which include this worker's requests).
        self.exposed = self.registry if shared_dir is None else merged_registry(shared_dir)
        self.exposed.register(BackendCollector(statuses))
        self.exposed.register(BatchCollector(batches))
        Info("tokenrelay_build", "tokenrelay version.", registry=self.exposed).info({"version": __version__})

    def observe(self, call: Call) -> None:
        self.requests.observe(call)

    def render(self) -> bytes:
        self.requests.flush()
        return generate_latest(self.exposed)

    def close(self) -> None:
        self.requests.flush()
        if self.shared_dir is not None:
            worker_exited(self.shared_dir)
