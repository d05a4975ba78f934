"""The metrics of one app, fed with real `Call` records and backend status dicts, read back from its registry."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from tokenrelay.backends.base import Usage
from tokenrelay.calls.record import Call
from tokenrelay.observability.metrics import Metrics
from tokenrelay.observability.metrics.batches import BatchProgress
from tokenrelay.observability.metrics.requests import FLUSH_SECONDS

UPSTREAM_STATUS: dict[str, Any] = {
    "backend": "upstream",
    "ready": True,
    "nodes": [
        {
            "name": "vllm-a",
            "url": "http://user:hunter2@10.0.0.5:8000",
            "in_flight": 3,
            "errors": 7,
            "breaker": "half_open",
            "healthy": False,
            "latency_ms_ewma": 250.0,
        },
        {"url": "http://nameless:secret@10.0.0.6"},  # no name: not exported rather than labelled by URL
    ],
}


def metrics_for(statuses: list[tuple[str, dict[str, Any]]]) -> Metrics:
    return Metrics(lambda: statuses, lambda: BatchProgress({"completed": 2}, 7))


def finished_call(**changes: Any) -> Call:
    call = Call(request_id="r1", endpoint="chat.completions", model="m", backend="llama.cpp", key_name="team-a")
    call.first_token_at = call.started + 0.2
    call.token_gaps = [0.02, 0.03, 0.5]
    call.usage = Usage(prompt_tokens=11, completion_tokens=4, cached_tokens=6)
    call.ended = call.started + 1.5
    for name, value in changes.items():
        setattr(call, name, value)
    return call


def test_a_finished_call_is_counted_timed_and_its_tokens_added() -> None:
    metrics = metrics_for([])
    metrics.observe(finished_call())
    metrics.observe(finished_call(status=499, cancelled=True))
    value = metrics.registry.get_sample_value
    labels = {"model": "m", "endpoint": "chat.completions"}
    assert value("tokenrelay_requests_total", {**labels, "status": "200", "key": "team-a"}) == 1
    assert value("tokenrelay_requests_total", {**labels, "status": "499", "key": "team-a"}) == 1
    assert value("tokenrelay_time_to_first_token_seconds_count", labels) == 2
    assert value("tokenrelay_time_to_first_token_seconds_bucket", {**labels, "le": "0.25"}) == 2
    assert value("tokenrelay_inter_token_gap_seconds_count", labels) == 6
    assert value("tokenrelay_inter_token_gap_seconds_bucket", {**labels, "le": "0.05"}) == 4
    assert value("tokenrelay_request_duration_seconds_sum", labels) == pytest.approx(3.0)
    tokens = {"model": "m", "key": "team-a"}
    assert value("tokenrelay_prompt_tokens_total", tokens) == 22
    assert value("tokenrelay_completion_tokens_total", tokens) == 8
    assert value("tokenrelay_cached_tokens_total", tokens) == 12


def test_unknown_models_do_not_become_label_values() -> None:
    metrics = metrics_for([])
    for name in ("typo-1", "typo-2"):
        metrics.observe(Call(request_id="r", endpoint="completions", model=name, status=404, error="model_not_found"))
    text = metrics.render().decode()
    assert "typo" not in text
    labels = {"model": "", "endpoint": "completions", "status": "404", "key": ""}
    assert metrics.registry.get_sample_value("tokenrelay_requests_total", labels) == 2
    timed = {"model": "", "endpoint": "completions"}
    assert metrics.registry.get_sample_value("tokenrelay_request_duration_seconds_count", timed) is None


def test_engine_status_is_read_at_scrape_time() -> None:
    status: dict[str, Any] = {"ready": True, "slots": 8, "busy_slots": 0, "queue_depth": 0, "tokens_generated": 5}
    metrics = metrics_for([("gemma", status)])
    value = metrics.registry.get_sample_value
    assert value("tokenrelay_engine_busy_slots", {"model": "gemma"}) == 0
    status.update(busy_slots=3, queue_depth=2, tokens_generated=40)
    assert value("tokenrelay_engine_slots", {"model": "gemma"}) == 8
    assert value("tokenrelay_engine_busy_slots", {"model": "gemma"}) == 3
    assert value("tokenrelay_engine_queue_depth", {"model": "gemma"}) == 2
    assert value("tokenrelay_engine_tokens_generated_total", {"model": "gemma"}) == 40
    assert value("tokenrelay_backend_ready", {"model": "gemma"}) == 1
    assert "tokenrelay_upstream" not in metrics.render().decode()


def test_upstream_nodes_are_exported_by_name_without_their_urls() -> None:
    metrics = metrics_for([("big", UPSTREAM_STATUS)])
    value = metrics.registry.get_sample_value
    node = {"model": "big", "node": "vllm-a"}
    assert value("tokenrelay_upstream_in_flight", node) == 3
    assert value("tokenrelay_upstream_errors_total", node) == 7
    assert value("tokenrelay_upstream_healthy", node) == 0
    assert value("tokenrelay_upstream_latency_seconds", node) == 0.25
    states = {
        s: value("tokenrelay_upstream_breaker_state", {**node, "state": s}) for s in ("closed", "open", "half_open")
    }
    assert states == {"closed": 0, "open": 0, "half_open": 1}
    text = metrics.render().decode()
    assert "hunter2" not in text and "10.0.0" not in text and "nameless" not in text


def test_each_app_has_its_own_registry() -> None:
    first, second = metrics_for([]), metrics_for([])
    first.observe(finished_call())
    labels = {"model": "m", "endpoint": "chat.completions", "status": "200", "key": "team-a"}
    assert first.registry.get_sample_value("tokenrelay_requests_total", labels) == 1
    assert second.registry.get_sample_value("tokenrelay_requests_total", labels) is None


def test_inside_a_loop_figures_are_applied_by_a_timer_or_a_scrape() -> None:
    labels = {"model": "m", "endpoint": "chat.completions", "status": "200", "key": "team-a"}
    timed = {"model": "m", "endpoint": "chat.completions"}
    scraped_line = 'tokenrelay_requests_total{endpoint="chat.completions",key="team-a",model="m",status="200"} 3.0'

    async def scenario() -> tuple[list[float | None], str]:
        metrics = metrics_for([])
        value = metrics.registry.get_sample_value
        seen = []
        metrics.observe(finished_call())
        metrics.observe(finished_call())
        seen.append(value("tokenrelay_requests_total", labels))  # pending: the series exists, still at 0
        await asyncio.sleep(FLUSH_SECONDS + 0.05)
        seen.append(value("tokenrelay_requests_total", labels))  # the timer applied both
        seen.append(value("tokenrelay_inter_token_gap_seconds_count", timed))
        metrics.observe(finished_call())
        text = metrics.render().decode()  # a scrape applies what is pending first
        seen.append(value("tokenrelay_completion_tokens_total", {"model": "m", "key": "team-a"}))
        return seen, text

    seen, text = asyncio.run(scenario())
    assert seen == [0, 2, 6, 12]
    assert scraped_line in text


def test_batches_by_state_and_lines_answered_are_shown() -> None:
    text = metrics_for([]).render().decode()
    assert 'tokenrelay_batches{state="completed"} 2.0' in text
    assert "tokenrelay_batch_lines_total 7.0" in text
