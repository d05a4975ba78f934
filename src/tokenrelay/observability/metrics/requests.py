"""Per-request metrics, recorded from each finished `Call`."""

from __future__ import annotations

import asyncio
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram

from tokenrelay.calls.record import Call

TTFT_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
GAP_BUCKETS = (0.005, 0.01, 0.02, 0.03, 0.05, 0.075, 0.1, 0.2, 0.5, 1.0, 2.5)
LATENCY_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)

TOKEN_HELP = {
    "prompt": "Prompt tokens of finished requests.",
    "completion": "Generated tokens of finished requests.",
    "cached": "Prompt tokens served from cache (also counted in prompt tokens).",
}


def model_label(call: Call) -> str:
    # Only served model ids become label values: a client naming a thousand unknown models must not
    # create a thousand time series. `backend` is set once the id resolved to a backend.
    return call.model if call.backend else ""


FLUSH_SECONDS = 0.1


class RequestMetrics:
    """Request counts, latencies and tokens, labelled by model, endpoint, status and key name.

    Inside an event loop a finished call's figures are added to pending totals (plain dicts) and applied to
    the Prometheus children at most `FLUSH_SECONDS` later, by a timer, or at once by `flush()` (every scrape
    calls it first). Applied call by call they would cost several updates a call, dearer still with several
    workers, whose values live in files (`prometheus_client`'s multiprocess mode: a lock, a pid check and an
    mmap write per value); pending, a busy server applies each series once per interval instead. A scrape of
    another worker sees this one's calls within the interval. Outside a loop (scripts, unit tests) each call
    is applied at once.
    """

    def __init__(self, registry: CollectorRegistry) -> None:
        self.requests = Counter(
            "tokenrelay_requests",
            "Generation requests by model, endpoint, HTTP status (499: client went away) and key name.",
            ["model", "endpoint", "status", "key"],
            registry=registry,
        )
        self.ttft = Histogram(
            "tokenrelay_time_to_first_token_seconds",
            "Time from receiving a request to its first generated token.",
            ["model", "endpoint"],
            buckets=TTFT_BUCKETS,
            registry=registry,
        )
        self.gap = Histogram(
            "tokenrelay_inter_token_gap_seconds",
            "Time between consecutive text deltas of one request.",
            ["model", "endpoint"],
            buckets=GAP_BUCKETS,
            registry=registry,
        )
        self.latency = Histogram(
            "tokenrelay_request_duration_seconds",
            "Total time of requests that reached a backend, whatever their outcome.",
            ["model", "endpoint"],
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )
        self.fallbacks = Counter(
            "tokenrelay_fallbacks",
            "Requests a fallback model served, by the model asked for and the model that served.",
            ["model", "served_model"],
            registry=registry,
        )
        self.tokens = {
            kind: Counter(f"tokenrelay_{kind}_tokens", text, ["model", "key"], registry=registry)
            for kind, text in TOKEN_HELP.items()
        }
        self._children: dict[tuple[Any, ...], Any] = {}
        self._counts: dict[Any, float] = {}  # counter child → increment not yet applied
        self._values: dict[Any, list[float]] = {}  # histogram child → observations not yet applied
        self._timer: asyncio.TimerHandle | None = None

    def observe(self, call: Call) -> None:
        model, key = model_label(call), call.key_name or ""
        self._count(self._child(self.requests, model, call.endpoint, str(call.status), key), 1)
        if call.backend:  # else rejected before any work: counted, but no latency or tokens to speak of
            self._observe(self._child(self.latency, model, call.endpoint), [call.latency])
            if call.ttft is not None:
                self._observe(self._child(self.ttft, model, call.endpoint), [call.ttft])
            if call.token_gaps:
                self._observe(self._child(self.gap, model, call.endpoint), call.token_gaps)
            self._count_tokens(call, model, key)
        if call.served_model is not None:  # a configured model id, as `model` is: bounded label values
            self._count(self._child(self.fallbacks, model, call.served_model), 1)
        self._applied_soon()

    def _count_tokens(self, call: Call, model: str, key: str) -> None:
        usage = call.usage
        counts = {"prompt": usage.prompt_tokens, "completion": usage.completion_tokens, "cached": usage.cached_tokens}
        for kind, count in counts.items():
            if count:
                self._count(self._child(self.tokens[kind], model, key), count)

    def _count(self, child: Any, amount: float) -> None:
        self._counts[child] = self._counts.get(child, 0) + amount

    def _observe(self, child: Any, values: list[float]) -> None:
        pending = self._values.get(child)
        if pending is None:
            self._values[child] = list(values)
        else:
            pending.extend(values)

    def _applied_soon(self) -> None:
        if self._timer is not None:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # no loop to come back on: applied now
            self.flush()
            return
        self._timer = loop.call_later(FLUSH_SECONDS, self.flush)

    def flush(self) -> None:
        """Apply every pending figure to its Prometheus series."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        counts, values = self._counts, self._values
        self._counts, self._values = {}, {}
        for child, amount in counts.items():
            child.inc(amount)
        for child, observed in values.items():
            for value in observed:
                child.observe(value)

    def _child(self, metric: Any, *labels: str) -> Any:
        # `labels()` validates and looks up its arguments on every call; the children are kept here by their
        # label values instead. Label values are bounded already (served model ids, key names), and series are
        # never removed.
        index = (id(metric), *labels)
        child = self._children.get(index)
        if child is None:
            child = self._children[index] = metric.labels(*labels)
        return child
