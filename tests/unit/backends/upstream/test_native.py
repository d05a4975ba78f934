"""Native relay to nodes that serve Responses or Messages themselves: the body as sent, the answer byte for byte,
usage for the ledger, node errors, failover and timeouts."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from aiohttp import web
from upstream_fakes import (
    ON_ASYNCIO,
    REFUSE,
    FakeNodes,
    Stream,
    answer,
    chat,
    drain,
    error,
    event_stream,
    nodes_fixture,
)

from tokenrelay.backends.base import Event, NativeRequest, Raw, Served, Usage
from tokenrelay.backends.upstream.failures import NodeRejection
from tokenrelay.config import RoutingSettings, UpstreamTimeouts
from tokenrelay.errors import UpstreamError

pytestmark = ON_ASYNCIO
nodes = nodes_fixture()

NATIVE = {"native_apis": ["responses", "messages"]}

RESPONSES_BODY = {
    "model": "m",
    "input": [{"role": "user", "content": "Hi"}],
    "max_output_tokens": 16,
    "previous_response_id": "resp_abc",
    "store": True,
    "metadata": {"x": "y"},
}
MESSAGES_BODY = {"model": "m", "max_tokens": 16, "messages": [{"role": "user", "content": "Hi"}]}

RESPONSE = {
    "id": "resp_node",
    "object": "response",
    "status": "completed",
    "error": None,
    "model": "node-model",
    "output": [{"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Hello there"}]}],
    "usage": {"input_tokens": 11, "output_tokens": 3, "input_tokens_details": {"cached_tokens": 4}},
}
MESSAGE = {
    "id": "msg_node",
    "type": "message",
    "role": "assistant",
    "content": [{"type": "text", "text": "Hello there"}],
    "usage": {"input_tokens": 9, "output_tokens": 2, "cache_read_input_tokens": 5},
}


def native(api: str, **fields: Any) -> NativeRequest:
    body = (RESPONSES_BODY if api == "responses" else MESSAGES_BODY) | fields
    return NativeRequest(api, body, chat("Hi"), {"anthropic-version": "2023-06-01"} if api == "messages" else {})  # type: ignore[arg-type]


def named(kind: str, payload: dict[str, Any]) -> bytes:
    return f"event: {kind}\ndata: {json.dumps({'type': kind, **payload})}\n\n".encode()


RESPONSES_STREAM = [
    named("response.created", {"sequence_number": 0, "response": {"id": "resp_node", "status": "in_progress"}}),
    named("response.output_text.delta", {"sequence_number": 1, "delta": "Hel"})
    + named("response.output_text.delta", {"sequence_number": 2, "delta": "lo"}),
    named("response.completed", {"sequence_number": 3, "response": RESPONSE}),
]
MESSAGES_STREAM = [
    named("message_start", {"message": MESSAGE | {"content": [], "usage": {"input_tokens": 9, "output_tokens": 1}}}),
    named("content_block_delta", {"index": 0, "delta": {"type": "text_delta", "text": "Hel"}}),
    b": ping\n\n" + named("message_delta", {"delta": {"stop_reason": "end_turn"}, "usage": {"output_tokens": 6}}),
    named("message_stop", {}),
]


def raw(events: list[Event]) -> bytes:
    return b"".join(e.data for e in events if isinstance(e, Raw))


def usage(events: list[Event]) -> Usage:
    found = [e for e in events if isinstance(e, Usage)]
    assert len(found) == 1 and events[-1] is found[0]
    return found[0]


def json_answer(body: dict[str, Any]) -> web.Response:
    return web.json_response(body)


async def test_the_body_goes_as_sent_with_only_model_rewritten(nodes: FakeNodes) -> None:
    nodes.on("a", answer(lambda: json_answer(RESPONSE)))
    backend = nodes.backend("a", model="node-model", api_key="node-key", **NATIVE)
    request = native("responses")
    events = await drain(backend.relay(request, "rid"))
    (seen,) = nodes.seen
    assert seen.path == "/a/v1/responses"
    assert seen.json() == RESPONSES_BODY | {"model": "node-model"}
    assert seen.headers["Authorization"] == "Bearer node-key"
    assert json.loads(raw(events)) == RESPONSE  # the node's whole body, `"error": null` included
    assert usage(events) == Usage(prompt_tokens=11, completion_tokens=3, cached_tokens=4)
    assert next(e for e in events if isinstance(e, Served)).node == "a"


async def test_messages_get_the_key_and_the_clients_anthropic_headers(nodes: FakeNodes) -> None:
    nodes.on("a", answer(lambda: json_answer(MESSAGE)))
    backend = nodes.backend("a", model="node-model", api_key="node-key", **NATIVE)
    events = await drain(backend.relay(native("messages"), "rid"))
    (seen,) = nodes.seen
    assert seen.path == "/a/v1/messages"
    assert seen.json() == MESSAGES_BODY | {"model": "node-model"}
    assert seen.headers["x-api-key"] == "node-key"
    assert seen.headers["anthropic-version"] == "2023-06-01"
    assert json.loads(raw(events)) == MESSAGE
    # Tokens read from the node's cache are part of the prompt.
    assert usage(events) == Usage(prompt_tokens=14, completion_tokens=2, cached_tokens=5)


@pytest.mark.parametrize(
    ("api", "parts", "expected"),
    [
        ("responses", RESPONSES_STREAM, Usage(prompt_tokens=11, completion_tokens=3, cached_tokens=4)),
        # message_start's counts, then message_delta's final output count.
        ("messages", MESSAGES_STREAM, Usage(prompt_tokens=9, completion_tokens=6)),
    ],
)
async def test_a_stream_passes_through_unchanged_and_its_usage_is_read(
    nodes: FakeNodes, api: str, parts: list[bytes], expected: Usage
) -> None:
    nodes.on("a", Stream(parts, pause=0.01).respond)
    backend = nodes.backend("a", **NATIVE)
    events = await drain(backend.relay(native(api, stream=True), "rid"))
    assert raw(events) == b"".join(parts)
    assert usage(events) == expected


async def test_without_usage_the_ledger_gets_an_estimate(nodes: FakeNodes) -> None:
    body = {k: v for k, v in MESSAGE.items() if k != "usage"}
    nodes.on("a", answer(lambda: json_answer(body)))
    events = await drain(nodes.backend("a", **NATIVE).relay(native("messages"), "rid"))
    found = usage(events)
    assert found.estimated and found.prompt_tokens > 0 and found.completion_tokens > 0


async def test_keepalives_before_the_first_event_go_out_with_it(nodes: FakeNodes) -> None:
    parts = [b": waiting\n\n", b": waiting\n\n", *RESPONSES_STREAM]
    nodes.on("a", Stream(parts).respond)
    batches = [batch async for batch in nodes.backend("a", **NATIVE).relay(native("responses", stream=True), "rid")]
    first = [e for e in batches[0] if isinstance(e, Raw)]
    assert first and first[0].data.startswith(b": waiting\n\n: waiting\n\n")
    assert raw([e for batch in batches for e in batch]) == b"".join(parts)


@pytest.mark.parametrize("api", ["responses", "messages"])
async def test_a_nodes_400_is_the_clients_with_its_message(nodes: FakeNodes, api: str) -> None:
    nodes.on("a", answer(lambda: error(400, "max_output_tokens is too large", param="max_output_tokens")))
    nodes.on("b", answer(lambda: json_answer(RESPONSE)))
    with pytest.raises(NodeRejection) as caught:
        await drain(nodes.backend("a", "b", **NATIVE).relay(native(api), "rid"))
    assert caught.value.status == 400 and caught.value.message == "max_output_tokens is too large"
    assert caught.value.param == "max_output_tokens"
    assert nodes.hits("b") == 0


async def test_a_404_naming_the_previous_response_is_the_clients(nodes: FakeNodes) -> None:
    nodes.on("a", answer(lambda: error(404, "No response 'resp_abc'.", param="previous_response_id")))
    with pytest.raises(NodeRejection) as caught:
        await drain(nodes.backend("a", **NATIVE).relay(native("responses"), "rid"))
    assert caught.value.status == 404 and caught.value.param == "previous_response_id"


@pytest.mark.parametrize(
    "failing",
    [
        REFUSE,
        answer(lambda: error(503, "busy")),
        answer(lambda: error(404, "no such path")),
        answer(lambda: event_stream(named("error", {"error": {"type": "overloaded_error", "message": "later"}}))),
    ],
    ids=["connect", "503", "404", "error-event"],
)
async def test_failures_before_the_first_byte_fail_over_to_the_next_native_node(nodes: FakeNodes, failing: Any) -> None:
    nodes.on("a", failing)
    nodes.on("b", Stream(MESSAGES_STREAM).respond)
    backend = nodes.backend("a", "b", **NATIVE)  # a is tried first (equal load)
    events = await drain(backend.relay(native("messages", stream=True), "rid"))
    assert next(e for e in events if isinstance(e, Served)).node == "b"
    assert raw(events) == b"".join(MESSAGES_STREAM)
    a = backend.nodes["a"].load
    assert (a.requests, a.failures, a.in_flight) == (1, 1, 0)  # the breaker and the status page count it


async def test_chat_only_nodes_are_passed_over(nodes: FakeNodes) -> None:
    nodes.on("a", answer(lambda: json_answer(RESPONSE)))
    nodes.on("b", answer(lambda: json_answer(RESPONSE)))
    backend = nodes.backend("a", **NATIVE)
    assert backend.relays("responses")
    await backend.add_node(backend.nodes["a"].settings.model_copy(update={"name": "b", "native_apis": []}))
    assert not backend.relays("responses")  # all or nothing
    for _ in range(3):
        await drain(backend.relay(native("responses"), "rid"))
    assert nodes.hits("b") == 0


def timed(**timeouts: float) -> RoutingSettings:
    return RoutingSettings(timeouts=UpstreamTimeouts(**timeouts))


async def test_no_first_event_in_time_fails_over_even_with_keepalives(nodes: FakeNodes) -> None:
    keepalives = Stream([b": keep-alive\n\n"] * 20 + RESPONSES_STREAM, pause=0.05)
    nodes.on("a", keepalives.respond)
    nodes.on("b", Stream(RESPONSES_STREAM).respond)
    backend = nodes.backend("a", "b", routing=timed(first_byte=0.3), **NATIVE)
    events = await drain(backend.relay(native("responses", stream=True), "rid"))
    assert next(e for e in events if isinstance(e, Served)).node == "b"
    assert raw(events) == b"".join(RESPONSES_STREAM)  # none of a's keep-alives reached the client


async def test_an_idle_gap_ends_the_stream_with_an_error_and_the_usage_so_far(nodes: FakeNodes) -> None:
    stalls = Stream([RESPONSES_STREAM[0], b": still here\n\n", RESPONSES_STREAM[1]], pauses={1: 0.2, 2: 0.2})
    nodes.on("a", stalls.respond)
    seen: list[Event] = []
    with pytest.raises(UpstreamError, match="timeout between events"):
        async for batch in nodes.backend("a", routing=timed(idle=0.3), **NATIVE).relay(
            native("responses", stream=True), "rid"
        ):
            seen.extend(batch)
    assert raw(seen) == RESPONSES_STREAM[0] + b": still here\n\n"  # after the first event, comments go out too
    assert usage(seen).estimated
    await asyncio.wait_for(stalls.abandoned.wait(), 1)


async def test_the_overall_limit_bounds_a_whole_answer(nodes: FakeNodes) -> None:
    async def hang(request: web.Request) -> web.Response:
        await asyncio.sleep(5)
        return json_answer(RESPONSE)

    nodes.on("a", hang)
    with pytest.raises(UpstreamError, match="timeout waiting for the node"):
        await drain(nodes.backend("a", routing=timed(overall=0.2), **NATIVE).relay(native("responses"), "rid"))


async def test_a_stream_cut_before_its_last_event_is_a_broken_stream(nodes: FakeNodes) -> None:
    nodes.on("a", Stream(RESPONSES_STREAM[:2]).respond)
    with pytest.raises(UpstreamError, match="ended before its last event"):
        await drain(nodes.backend("a", **NATIVE).relay(native("responses", stream=True), "rid"))


async def test_a_failed_response_object_is_relayed_not_retried(nodes: FakeNodes) -> None:
    failed = RESPONSE | {"status": "failed", "error": {"code": "server_error", "message": "x"}}
    nodes.on("a", answer(lambda: json_answer(failed)))
    nodes.on("b", answer(lambda: json_answer(RESPONSE)))
    events = await drain(nodes.backend("a", "b", **NATIVE).relay(native("responses"), "rid"))
    assert json.loads(raw(events)) == failed
    assert nodes.hits("b") == 0


async def test_an_error_body_in_place_of_a_response_fails_over(nodes: FakeNodes) -> None:
    nodes.on("a", answer(lambda: json_answer({"error": {"message": "model crashed"}})))
    nodes.on("b", answer(lambda: json_answer(RESPONSE)))
    events = await drain(nodes.backend("a", "b", **NATIVE).relay(native("responses"), "rid"))
    assert json.loads(raw(events)) == RESPONSE
