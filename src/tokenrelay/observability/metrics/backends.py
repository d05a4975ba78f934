"""Backend state read at scrape time: the embedded engine's slots and queue, upstream nodes' health.

Backends report plain `status()` dicts; this collector turns the keys it knows into metric families and
ignores the rest, so a backend gains metrics by reporting a known key and nothing here knows backend types.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

BackendStatus = tuple[str, Mapping[str, Any]]  # (model id, backend.status())
BREAKER_STATES = ("closed", "open", "half_open")


@dataclass(frozen=True)
class Stat:
    """One numeric status key exported as a metric family."""

    key: str
    name: str
    help: str
    counter: bool = False
    scale: float = 1.0

    def family(self, labels: list[str]) -> GaugeMetricFamily | CounterMetricFamily:
        kind = CounterMetricFamily if self.counter else GaugeMetricFamily
        return kind(self.name, self.help, labels=labels)


ENGINE_STATS = (
    Stat("slots", "tokenrelay_engine_slots", "Sequences the embedded engine decodes together."),
    Stat("busy_slots", "tokenrelay_engine_busy_slots", "Slots serving a request now."),
    Stat("queue_depth", "tokenrelay_engine_queue_depth", "Requests waiting for a free slot."),
    Stat("cells", "tokenrelay_engine_kv_cells", "KV cells of the engine's slots, long ones included."),
    Stat("cells_in_use", "tokenrelay_engine_kv_cells_in_use", "KV cells held by the requests running now."),
    Stat("steps", "tokenrelay_engine_steps", "Decode steps run.", counter=True),
    Stat("prompt_tokens_evaluated", "tokenrelay_engine_prompt_tokens_evaluated", "Prompt tokens run.", counter=True),
    Stat("tokens_generated", "tokenrelay_engine_tokens_generated", "Tokens sampled.", counter=True),
    Stat(
        "aborted_steps",
        "tokenrelay_engine_aborted_steps",
        "Background decode steps stopped for an arriving interactive request (and run again).",
        counter=True,
    ),
    Stat(
        "prefix_copies",
        "tokenrelay_engine_prefix_copies",
        "Prompts started from a copy of the cached prefix another slot holds.",
        counter=True,
    ),
    Stat(
        "pieces_beside",
        "tokenrelay_engine_prompt_pieces_beside",
        "Long prompts' pieces evaluated beside the decoding streams, on a core of their own.",
        counter=True,
    ),
    Stat("drafted_tokens", "tokenrelay_engine_drafted_tokens", "Prompt-lookup guesses decoded.", counter=True),
    Stat("accepted_drafts", "tokenrelay_engine_accepted_drafts", "Guesses the sampler drew anyway.", counter=True),
    # Residency of engine models loaded on demand (backends/resident.py).
    Stat("resident", "tokenrelay_model_resident", "1 while the engine model is in memory (loading included)."),
    Stat("memory_bytes", "tokenrelay_model_memory_bytes", "Estimated memory of the model: weights plus KV cache."),
    Stat("loads", "tokenrelay_model_loads", "Times the model was loaded.", counter=True),
    Stat("unloads", "tokenrelay_model_unloads", "Times the model was unloaded.", counter=True),
    Stat("load_seconds", "tokenrelay_model_load_seconds", "Seconds spent loading the model.", counter=True),
)
NODE_STATS = (
    Stat("in_flight", "tokenrelay_upstream_in_flight", "Requests in flight to an upstream node."),
    Stat("errors", "tokenrelay_upstream_errors", "Failed requests to an upstream node.", counter=True),
    Stat("healthy", "tokenrelay_upstream_healthy", "1 when the node passes its health checks."),
    Stat(
        "latency_ms_ewma",
        "tokenrelay_upstream_latency_seconds",
        "Moving average of the node's response latency.",
        scale=0.001,
    ),
)


def number(value: object) -> float | None:
    """Numbers and booleans become floats; anything else is not a sample."""
    return float(value) if isinstance(value, int | float) else None


class BackendCollector(Collector):
    """A custom collector: asks every backend for its status on each scrape (no polling, nothing stale)."""

    def __init__(self, statuses: Callable[[], Iterable[BackendStatus]]) -> None:
        self.statuses = statuses

    def collect(self) -> Iterator[Metric]:
        statuses = list(self.statuses())
        yield ready_family(statuses)
        yield from engine_families(statuses)
        nodes = [(model, node) for model, status in statuses for node in named_nodes(status)]
        if nodes:  # no upstream families at all on a server without upstream nodes
            yield from node_families(nodes)
            yield breaker_family(nodes)


def ready_family(statuses: list[BackendStatus]) -> GaugeMetricFamily:
    family = GaugeMetricFamily("tokenrelay_backend_ready", "1 when the model's backend can serve.", labels=["model"])
    for model, status in statuses:
        family.add_metric([model], 1.0 if status.get("ready") else 0.0)
    return family


def engine_families(statuses: list[BackendStatus]) -> Iterator[Metric]:
    for stat in ENGINE_STATS:
        family = stat.family(["model"])
        for model, status in statuses:
            value = number(status.get(stat.key))
            if value is not None:
                family.add_metric([model], value * stat.scale)
        yield family


def named_nodes(status: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    # Nodes are labelled by name only: their URLs may carry credentials and never become label values.
    nodes = status.get("nodes")
    if not isinstance(nodes, list):
        return []
    return [node for node in nodes if isinstance(node, Mapping) and isinstance(node.get("name"), str)]


def node_families(nodes: list[tuple[str, Mapping[str, Any]]]) -> Iterator[Metric]:
    for stat in NODE_STATS:
        family = stat.family(["model", "node"])
        for model, node in nodes:
            value = number(node.get(stat.key))
            if value is not None:
                family.add_metric([model, node["name"]], value * stat.scale)
        yield family


def breaker_family(nodes: list[tuple[str, Mapping[str, Any]]]) -> GaugeMetricFamily:
    """A state set: one series per known state, 1 on the node's current state."""
    family = GaugeMetricFamily(
        "tokenrelay_upstream_breaker_state",
        "Circuit breaker state of an upstream node.",
        labels=["model", "node", "state"],
    )
    for model, node in nodes:
        current = node.get("breaker")
        if not isinstance(current, str):
            continue
        for state in dict.fromkeys((*BREAKER_STATES, current)):
            family.add_metric([model, node["name"], state], 1.0 if state == current else 0.0)
    return family
