"""OpenTelemetry traces exported to a real OTLP/HTTP receiver: the span tree of a call on the engine and of a
call relayed to a tokenrelay node (one trace across both servers), a continued `traceparent`, content kept out
by default, and a dead collector costing the clients nothing."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import yaml
from helpers import CHAT_MODEL
from otlp_receiver import ReceivedSpan, Receiver, otlp_receiver
from servers import Server, free_port, start_server

SPAN_KIND_SERVER, SPAN_KIND_CLIENT = 2, 3
PROMPT = [{"role": "user", "content": "Say hello to the harbour."}]


def traced_env(endpoint: str, name: str = "tokenrelay", **extra: str) -> dict[str, str]:
    return {
        "TOKENRELAY_TELEMETRY__OTLP_ENDPOINT": endpoint,
        "TOKENRELAY_TELEMETRY__SERVICE_NAME": name,
        "OTEL_BSP_SCHEDULE_DELAY": "100",  # export within a tenth of a second, so the test waits little
        **extra,
    }


@pytest.fixture(scope="module")
def receiver() -> Iterator[Receiver]:
    with otlp_receiver() as running:
        yield running


@pytest.fixture(scope="module")
def traced(receiver: Receiver, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    tmp = tmp_path_factory.mktemp("traced")
    server = start_server(tmp, "--database-url", f"sqlite:///{tmp}/ledger.db", env=traced_env(receiver.url, "edge"))
    yield server
    server.stop()


def call_span(receiver: Receiver, request_id: str, service: str = "edge") -> ReceivedSpan:
    """The call's own span (GenAI attributes), once exported."""

    def found(spans: list[ReceivedSpan]) -> ReceivedSpan | None:
        return next(
            (
                s
                for s in spans
                if s.service == service
                and s.attributes.get("tokenrelay.request_id") == request_id
                and "gen_ai.usage.output_tokens" in s.attributes
            ),
            None,
        )

    return receiver.wait_for(found)


def parent_of(receiver: Receiver, span: ReceivedSpan) -> ReceivedSpan:
    return receiver.wait_for(lambda spans: next((s for s in spans if s.span_id == span.parent_id), None))


def test_a_streamed_chat_on_the_engine_is_one_span_tree(traced: Server, receiver: Receiver) -> None:
    client = traced.client()
    raw = client.chat.completions.with_raw_response.create(
        model=CHAT_MODEL,
        messages=PROMPT,
        max_tokens=6,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    request_id = raw.headers["x-request-id"]
    chunks = list(raw.parse())
    usage = chunks[-1].usage

    span = call_span(receiver, request_id)
    attributes = span.attributes
    assert span.name == f"chat {CHAT_MODEL}"
    server = parent_of(receiver, span)  # the HTTP server span of OpenTelemetry's ASGI instrumentation
    assert server.kind == SPAN_KIND_SERVER and server.name.startswith("POST /v1/chat/completions")
    assert server.attributes["http.status_code"] == 200
    assert attributes["gen_ai.operation.name"] == "chat"
    assert attributes["gen_ai.request.model"] == attributes["gen_ai.response.model"] == CHAT_MODEL
    assert attributes["gen_ai.request.max_tokens"] == 6 and attributes["gen_ai.request.temperature"] == 0
    assert attributes["gen_ai.usage.input_tokens"] == usage.prompt_tokens
    assert attributes["gen_ai.usage.output_tokens"] == usage.completion_tokens
    assert attributes["gen_ai.response.finish_reasons"] == ["length"]
    first_token = span.events["gen_ai.first_token"]["_time"]
    assert span.start_ns < first_token < span.end_ns
    # No prompt, completion or key on any span of the trace unless content capture is on.
    assert not any(
        "gen_ai.input.messages" in s.attributes or "gen_ai.output.messages" in s.attributes for s in receiver.spans
    )

    children = {s.name: s for s in receiver.children(span)}
    assert {"admission", "llama.cpp generate"} <= set(children)
    generate = children["llama.cpp generate"]
    stages = receiver.wait_for(lambda _: {s.name: s for s in receiver.children(generate)})
    assert set(stages) == {"queue", "prompt", "decode"}
    assert (
        stages["queue"].end_ns <= stages["prompt"].start_ns + 1
        and stages["prompt"].end_ns <= stages["decode"].start_ns + 1
    )
    assert stages["decode"].attributes["tokenrelay.completion_tokens"] == usage.completion_tokens
    assert stages["prompt"].attributes["tokenrelay.prompt_tokens"] == usage.prompt_tokens
    # The ledger writes rows in batches after their calls: each write is a span of its own, linked to the calls.
    write = receiver.wait_for(
        lambda spans: next(
            (s for s in spans if s.name == "ledger write" and (span.trace_id, span.span_id) in s.links), None
        )
    )
    assert write.attributes["tokenrelay.ledger.rows"] >= 1


def test_an_incoming_traceparent_is_continued(traced: Server, receiver: Receiver) -> None:
    trace_id, parent = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
    with traced.http() as http:
        answer = http.post(
            "/v1/embeddings",
            json={"model": CHAT_MODEL, "input": "the harbour"},
            headers={"traceparent": f"00-{trace_id}-{parent}-01"},
        )
    assert answer.status_code == 200
    span = call_span(receiver, answer.headers["x-request-id"])
    assert span.trace_id == trace_id and parent_of(receiver, span).parent_id == parent
    assert span.attributes["gen_ai.operation.name"] == "embeddings"


def test_a_relayed_call_is_one_trace_across_the_gateway_and_its_node(receiver: Receiver, tmp_path: Path) -> None:
    """The gateway knows a dead node and a live tokenrelay node: the attempts on both are spans, the dead one with
    its retry reason, and the live node's spans continue the attempt that reached it."""
    node = start_server(
        tmp_path, "--database-url", f"sqlite:///{tmp_path}/node.db", env=traced_env(receiver.url, "node")
    )
    try:
        upstreams = [
            {"url": f"http://127.0.0.1:{free_port()}/v1", "name": "dead"},
            {"url": f"{node.base_url}/v1", "name": "live"},
        ]
        config = tmp_path / "gateway.yaml"
        routing = {"health": {"probe_interval": 0}}  # no probe marks the dead node down before a request finds it
        config.write_text(yaml.safe_dump({"routing": routing, "models": [{"id": CHAT_MODEL, "upstreams": upstreams}]}))
        gateway = start_server(
            tmp_path,
            "--config",
            str(config),
            "--database-url",
            f"sqlite:///{tmp_path}/gw.db",
            env=traced_env(receiver.url, "gateway"),
            data_dir=tmp_path,
        )
        try:
            client = gateway.client()
            request_ids = [
                client.chat.completions.with_raw_response.create(
                    model=CHAT_MODEL, messages=PROMPT, max_tokens=4, temperature=0
                ).headers["x-request-id"]
                for _ in range(2)  # nodes are taken in turn: one of the two calls tries the dead node first
            ]
        finally:
            gateway.stop()
    finally:
        node.stop()
    fronts = [call_span(receiver, request_id, "gateway") for request_id in request_ids]
    assert all(front.attributes["tokenrelay.node"] == "live" for front in fronts)
    attempts = {
        front.span_id: sorted(
            (s for s in receiver.children(front) if s.kind == SPAN_KIND_CLIENT), key=lambda s: s.start_ns
        )
        for front in fronts
    }
    failed_over = next(front for front in fronts if len(attempts[front.span_id]) == 2)
    dead, live = attempts[failed_over.span_id]
    assert (dead.name, live.name) == ("upstream dead", "upstream live")
    assert dead.attributes["tokenrelay.retry_reason"] and "tokenrelay.retry_reason" not in live.attributes
    back = receiver.wait_for(
        lambda spans: next(
            (
                s
                for s in spans
                if s.service == "node" and s.trace_id == failed_over.trace_id and s.kind == SPAN_KIND_SERVER
            ),
            None,
        )
    )
    assert back.parent_id == live.span_id  # the node's server span continues the attempt that reached it
    node_call = receiver.wait_for(lambda _: next(iter(receiver.children(back)), None))
    assert node_call.attributes["gen_ai.request.model"] == CHAT_MODEL


def test_content_is_captured_only_when_asked(receiver: Receiver, tmp_path: Path) -> None:
    env = traced_env(receiver.url, "capturing", TOKENRELAY_TELEMETRY__CAPTURE_CONTENT="true")
    server = start_server(tmp_path, "--database-url", f"sqlite:///{tmp_path}/c.db", env=env)
    try:
        reply = server.client().chat.completions.with_raw_response.create(
            model=CHAT_MODEL, messages=PROMPT, max_tokens=4, temperature=0
        )
        text = reply.parse().choices[0].message.content
        span = call_span(receiver, reply.headers["x-request-id"], "capturing")
    finally:
        server.stop()
    assert "Say hello to the harbour." in span.attributes["gen_ai.input.messages"]
    assert span.attributes["gen_ai.output.messages"] == text


def test_a_dead_collector_costs_the_clients_nothing_and_the_log_one_line(tmp_path: Path) -> None:
    dead = f"http://127.0.0.1:{free_port()}/v1/traces"
    server = start_server(tmp_path, "--database-url", f"sqlite:///{tmp_path}/d.db", env=traced_env(dead))
    try:
        client = server.client()
        for _ in range(3):
            reply = client.chat.completions.create(model=CHAT_MODEL, messages=PROMPT, max_tokens=2, temperature=0)
            assert reply.choices[0].message.content is not None
        with httpx.Client(base_url=server.base_url) as http:
            assert http.get("/health").status_code == 200
    finally:
        server.stop()
    warnings = re.findall(r"telemetry: the collector at .* refuses traces", server.log())
    assert len(warnings) == 1, server.log()[-3000:]
