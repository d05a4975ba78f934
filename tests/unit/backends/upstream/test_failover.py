"""Failover before the first byte, node errors passed through or summed up, timeouts, cancellation."""

from __future__ import annotations

import asyncio

import pytest
from aiohttp import web
from upstream_fakes import (
    ON_ASYNCIO,
    REFUSE,
    FakeNodes,
    Stream,
    answer,
    chat,
    chunk,
    drain,
    error,
    event_stream,
    nodes_fixture,
    sse,
    text_of,
    usage_chunk,
)

from tokenrelay.backends.base import Served, TextDelta, Ticket, Usage
from tokenrelay.config import RoutingSettings, UpstreamTimeouts
from tokenrelay.errors import APIError, Overloaded, UpstreamError

pytestmark = ON_ASYNCIO
nodes = nodes_fixture()

GOOD = sse(chunk("fine", finish="stop"), usage_chunk(1, 1))


def good() -> web.Response:
    return event_stream(GOOD)


def served_by(events: list[object]) -> str:
    return next(e.node for e in events if isinstance(e, Served))


async def serve(nodes: FakeNodes, *names: str, routing: RoutingSettings | None = None, **node: object) -> list[object]:
    return await drain(nodes.backend(*names, routing=routing, **node).chat(chat(stream=True), Ticket("rid")))


@pytest.mark.parametrize(
    "failing",
    [
        REFUSE,
        answer(lambda: error(500, "boom")),
        answer(lambda: error(502, "bad gateway")),
        answer(lambda: error(429, "slow down")),
        answer(lambda: error(401, "wrong node key")),
        answer(lambda: web.Response(text="<html>not json</html>", content_type="text/html")),
    ],
    ids=["connect", "500", "502", "429", "401", "garbage"],
)
async def test_node_failures_before_the_first_byte_fail_over(nodes: FakeNodes, failing: object) -> None:
    nodes.on("a", failing)
    nodes.on("b", answer(good))
    backend = nodes.backend("a", "b")
    events = await drain(backend.chat(chat(stream=True), Ticket("rid")))
    assert served_by(events) == "b"
    a = backend.nodes["a"].load
    assert (a.requests, a.failures, a.in_flight) == (1, 1, 0)
    assert nodes.hits("b") == 1
    assert text_of(events) == "fine"


@pytest.mark.parametrize("status", [400, 413, 422])
async def test_a_nodes_4xx_reaches_the_client_with_its_status_and_message(nodes: FakeNodes, status: int) -> None:
    nodes.on("a", answer(lambda: error(status, "max_tokens is too large: 99999", param="max_tokens", code="bad")))
    nodes.on("b", answer(good))
    with pytest.raises(APIError) as caught:
        await serve(nodes, "a", "b")
    assert caught.value.status == status
    assert caught.value.body() == {
        "error": {
            "message": "max_tokens is too large: 99999",
            "type": "invalid_request_error",
            "param": "max_tokens",
            "code": "bad",
        }
    }
    assert nodes.hits("b") == 0


async def test_a_fastapi_style_422_keeps_its_detail_as_the_message(nodes: FakeNodes) -> None:
    detail = [{"loc": ["body", "messages"], "msg": "field required"}]
    nodes.on("a", answer(lambda: web.json_response({"detail": detail}, status=422)))
    with pytest.raises(APIError) as caught:
        await serve(nodes, "a")
    assert caught.value.status == 422 and "field required" in caught.value.message


async def test_every_node_failing_gives_502_without_addresses_or_keys(nodes: FakeNodes) -> None:
    nodes.on("a", REFUSE)
    nodes.on("b", answer(lambda: error(500, "internal detail of b")))
    with pytest.raises(UpstreamError) as caught:
        await serve(nodes, "a", "b", api_key="sk-node-secret")
    message = caught.value.message
    assert caught.value.status == 502
    assert "tried 2 nodes" in message and "connection failed" in message and "HTTP 500" in message
    for secret in ("a.test", "b.test", "sk-node-secret", "internal detail"):
        assert secret not in message


async def test_every_node_busy_gives_503(nodes: FakeNodes) -> None:
    nodes.on("a", answer(lambda: error(429, "busy")))
    nodes.on("b", answer(lambda: error(503, "busy")))
    with pytest.raises(Overloaded) as caught:
        await serve(nodes, "a", "b")
    assert caught.value.status == 503 and "busy" in caught.value.message


async def test_attempts_are_bounded_by_max_attempts(nodes: FakeNodes) -> None:
    for name in "abcd":
        nodes.on(name, answer(lambda: error(500, "x")))
    with pytest.raises(UpstreamError, match="tried 2 nodes"):
        await serve(nodes, "a", "b", "c", "d", routing=RoutingSettings(max_attempts=2))
    assert len(nodes.seen) == 2


async def test_a_failure_after_the_first_chunk_is_not_retried(nodes: FakeNodes) -> None:
    broken = Stream([sse(chunk("half"), done=False), b"data: {not json\n\n"])
    nodes.on("a", broken.respond)
    nodes.on("b", answer(good))
    backend = nodes.backend("a", "b")
    seen: list[object] = []
    with pytest.raises(UpstreamError, match="failed while streaming"):
        async for events in backend.chat(chat(stream=True), Ticket("rid")):
            seen.extend(events)
    assert nodes.hits("b") == 0
    assert backend.nodes["a"].load.failures == 1 and backend.nodes["a"].load.in_flight == 0
    assert isinstance(seen[-1], Usage) and seen[-1].estimated


def slow_routing(**timeouts: float) -> RoutingSettings:
    return RoutingSettings(timeouts=UpstreamTimeouts(**timeouts))


async def test_no_first_chunk_in_time_fails_over_even_with_keepalives(nodes: FakeNodes) -> None:
    keepalives = Stream([b": keep-alive\n\n"] * 20 + [GOOD], pause=0.05)
    nodes.on("a", keepalives.respond)
    nodes.on("b", answer(good))
    events = await serve(nodes, "a", "b", routing=slow_routing(first_byte=0.3))
    assert served_by(events) == "b"
    assert keepalives.sent < 20


async def test_an_idle_gap_between_chunks_ends_the_stream_with_an_error(nodes: FakeNodes) -> None:
    stalls = Stream([sse(chunk("a"), done=False), b": still here\n\n", sse(chunk("b"))], pauses={1: 0.2, 2: 0.2})
    nodes.on("a", stalls.respond)
    backend = nodes.backend("a", routing=slow_routing(idle=0.3))
    with pytest.raises(UpstreamError, match="timeout between chunks"):
        await drain(backend.chat(chat(stream=True), Ticket("rid")))
    await asyncio.wait_for(stalls.abandoned.wait(), 1)  # the node's response was closed, not left open


async def test_the_overall_limit_bounds_a_non_streamed_request(nodes: FakeNodes) -> None:

    async def hang(request: web.Request) -> web.Response:
        await asyncio.sleep(5)
        return good()

    nodes.on("a", hang)
    backend = nodes.backend("a", routing=slow_routing(overall=0.2))
    with pytest.raises(UpstreamError, match="timeout waiting for the node"):
        await drain(backend.chat(chat(), Ticket("rid")))


async def test_the_overall_limit_ends_a_stream_that_keeps_going(nodes: FakeNodes) -> None:
    trickle = Stream([sse(chunk("t "), done=False)] * 50, pause=0.1)
    nodes.on("a", trickle.respond)
    backend = nodes.backend("a", routing=slow_routing(idle=1, overall=0.35))
    with pytest.raises(UpstreamError, match=r"timeout between chunks \(overall limit\)"):
        await drain(backend.chat(chat(stream=True), Ticket("rid")))
    assert 1 <= trickle.sent < 6


async def test_closing_the_stream_early_closes_the_nodes_response_at_once(nodes: FakeNodes) -> None:
    endless = Stream([sse(chunk(f"{i} "), done=False) for i in range(1000)], pause=0.01)
    nodes.on("a", endless.respond)
    backend = nodes.backend("a")
    events = backend.chat(chat(stream=True), Ticket("rid"))
    served, first = await anext(events)  # who answered, with what the first read brought
    assert isinstance(served, Served) and isinstance(first, TextDelta)
    await events.aclose()  # what the server does when the client goes away
    await asyncio.wait_for(endless.abandoned.wait(), 1)
    assert endless.sent < 10
    assert backend.nodes["a"].load.in_flight == 0


async def test_cancelling_the_request_task_closes_the_nodes_response(nodes: FakeNodes) -> None:
    endless = Stream([sse(chunk("x"), done=False)] * 1000, pause=0.05)
    nodes.on("a", endless.respond)
    backend = nodes.backend("a")
    task = asyncio.ensure_future(drain(backend.chat(chat(stream=True), Ticket("rid"))))
    await asyncio.sleep(0.2)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await asyncio.wait_for(endless.abandoned.wait(), 1)
    assert backend.nodes["a"].load.in_flight == 0
