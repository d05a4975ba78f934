"""Prometheus metrics of one app: its own registry (never the process-global one), built with the app."""

from __future__ import annotations

from collections.abc import Callable, Iterable

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Info, generate_latest

from tokenrelay import __version__
from tokenrelay.calls import Call
from tokenrelay.metrics.backends import BackendCollector, BackendStatus
from tokenrelay.metrics.requests import RequestMetrics

__all__ = ["CONTENT_TYPE_LATEST", "Metrics"]


class Metrics:
    """Everything `/metrics` shows: request metrics fed by finished calls, backend state read at scrape time."""

    def __init__(self, statuses: Callable[[], Iterable[BackendStatus]]) -> None:
        self.registry = CollectorRegistry()
        self.requests = RequestMetrics(self.registry)
        self.registry.register(BackendCollector(statuses))
        Info("tokenrelay_build", "tokenrelay version.", registry=self.registry).info({"version": __version__})

    def observe(self, call: Call) -> None:
        self.requests.observe(call)

    def render(self) -> bytes:
        return generate_latest(self.registry)
