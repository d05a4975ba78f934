"""How a streamed answer's frames are grouped into writes to the client.

A node's read of several chunks goes out as one ASGI message (the relay flushes before it waits again);
a producer that does not pace itself, like the embedded engine, has every frame sent on its own. The
frames themselves, and their order, are the same either way.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from tokenrelay.api.generation import streamed
from tokenrelay.backends.base import Event, Finish, TextDelta
from tokenrelay.backends.upstream.backend import RoutedBackend
from tokenrelay.backends.upstream.members import EmbeddedMember
from tokenrelay.config import RoutingSettings, UpstreamHealth, UpstreamSettings
from tokenrelay.deadlines import Deadlines
from tokenrelay.outbox import Outbox
from tokenrelay.render.chat import ChatChunker
from tokenrelay.render.common import ResponseMeta
from upstream_fakes import (
    ON_ASYNCIO,
    FakeNodes,
    Stream,
    answer,
    chat,
    chunk,
    error,
    event_stream,
    nodes_fixture,
    sse,
    usage_chunk,
)

pytestmark = ON_ASYNCIO
nodes = nodes_fixture()

META = ResponseMeta(id="chatcmpl-1", created=0, model="m", system_fingerprint="fp", choices=1)


async def writes_of(events: AsyncIterator[Event]) -> list[list[bytes]]:
    """Serve the events as an SSE response; the frames of each body message, in order. The call is reported
    once, after the last body message."""
    bodies: list[dict[str, Any]] = []
    reports: list[int] = []  # the number of body messages sent when the call was reported
    response = await streamed(
        ChatChunker(META, want_logprobs=False).chunks(events), Deadlines(), lambda: reports.append(len(bodies))
    )
    done = asyncio.Event()

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.body":
            bodies.append(message)
            if not message["more_body"]:
                done.set()

    async def receive() -> dict[str, str]:
        await done.wait()  # what a server answers a pending receive once the response is complete
        return {"type": "http.disconnect"}

    await response({"type": "http"}, receive, send)
    assert [m["more_body"] for m in bodies] == [True] * (len(bodies) - 1) + [False]
    assert reports == [len(bodies)]
    return [[f + b"\n\n" for f in m["body"].split(b"\n\n") if f] for m in bodies]


def content(frame: bytes) -> str:
    return frame.decode()


async def test_each_read_from_a_node_is_one_write(nodes: FakeNodes) -> None:
    first = sse(chunk("", role="assistant"), chunk("a"), chunk("b"), done=False)
    second = sse(chunk("c"), chunk(finish="stop"), usage_chunk(3, 3))
    nodes.on("a", Stream([first, second], pause=0.1).respond)
    writes = await writes_of(nodes.backend("a").chat(chat(stream=True), "rid"))
    assert len(writes) == 2, writes
    opening, a, b = writes[0]
    assert '"role":"assistant"' in content(opening) and '"content":"a"' in content(a) and '"content":"b"' in content(b)
    c, finish, end = writes[1]
    assert '"content":"c"' in content(c) and '"finish_reason":"stop"' in content(finish) and end == b"data: [DONE]\n\n"


async def test_a_node_sending_chunk_by_chunk_gets_a_write_per_chunk(nodes: FakeNodes) -> None:
    parts = [sse(chunk("", role="assistant"), done=False)] + [sse(chunk(w), done=False) for w in "xyz"]
    nodes.on("a", Stream([*parts, sse(chunk(finish="stop"))], pause=0.05).respond)
    writes = await writes_of(nodes.backend("a").chat(chat(stream=True), "rid"))
    # The role chunk alone makes no event, so the first write is the opening with "x"; then one per read.
    assert [len(w) for w in writes] == [2, 1, 1, 2]
    assert '"content":"z"' in content(writes[2][0]) and writes[-1][-1] == b"data: [DONE]\n\n"


async def test_after_a_node_fails_before_its_first_chunk_the_next_member_is_not_held(nodes: FakeNodes) -> None:
    nodes.on("a", lambda request: asyncio.sleep(0, error(500, "down")))
    parts = [sse(chunk(w), done=False) for w in "xy"]
    nodes.on("b", Stream([*parts, sse(chunk(finish="stop"))], pause=0.05).respond)
    backend = nodes.backend("a", "b")
    writes = await writes_of(backend.chat(chat(stream=True), "rid"))
    assert [len(w) for w in writes] == [2, 1, 2]  # opening and x, y, finish and [DONE]: each of b's reads


class SlowEngine:
    """An embedded engine's stand-in: a token at a time, never pacing its stream."""

    kind = "llama.cpp"

    async def chat(self, request: object, request_id: str) -> AsyncIterator[Event]:
        for word in ("x", "y"):
            await asyncio.sleep(0.02)
            yield TextDelta(0, word)
        yield Finish(0, "stop")

    async def close(self) -> None:
        pass


async def test_an_engine_taking_over_from_a_node_that_failed_first_is_not_held(nodes: FakeNodes) -> None:
    nodes.on("a", answer(lambda: event_stream(b": hello\n\ndata: {not json\n\n")))  # fails in its stream
    routing = RoutingSettings(health=UpstreamHealth(probe_interval=0))
    engine = EmbeddedMember(SlowEngine(), routing, max_in_flight=None)  # type: ignore[arg-type]
    backend = RoutedBackend("m", routing, [UpstreamSettings(url=nodes.url("a"), name="a")], embedded=engine)
    engine.load.last_pick = 1  # the node is tried first
    writes = await writes_of(backend.chat(chat(stream=True), "rid"))
    await backend.close()
    assert [len(w) for w in writes] == [1, 1, 1, 1, 1, 0]  # nothing the node left behind holds the engine's frames


async def test_a_producer_that_does_not_pace_itself_gets_every_frame_sent_alone() -> None:
    async def engine() -> AsyncIterator[Event]:
        for word in ("one", " two"):
            yield TextDelta(0, word)
        yield Finish(0, "stop")

    writes = await writes_of(engine())
    assert [len(w) for w in writes] == [1, 1, 1, 1, 1, 0]  # opening, one, two, finish, [DONE], the end


async def test_the_outbox_holds_only_while_paced_and_keeps_the_order() -> None:
    sent: list[tuple[bytes, bool]] = []

    async def send(message: dict[str, Any]) -> None:
        sent.append((message["body"], message["more_body"]))

    outbox = Outbox()
    outbox.attach(send)
    await outbox.put(b"1")
    outbox.paced = True
    await outbox.put(b"2")
    await outbox.put(b"3")
    assert sent == [(b"1", True)]
    await outbox.flush()
    await outbox.put(b"4")
    outbox.paced = False
    await outbox.put(b"5")  # what is held goes first
    await outbox.close()
    assert sent == [(b"1", True), (b"23", True), (b"45", True), (b"", False)]


async def test_a_stream_is_reported_once_after_its_last_write_or_when_the_client_is_gone() -> None:
    """The log line, metrics and ledger row of a stream are made once its bytes are out, as a whole answer's
    are (`ReportedResponse`): made as the events ended, they came before the last write. A client that went
    away mid-stream still gets its call reported, once, with the events closed first."""
    closed: list[bool] = []

    async def engine() -> AsyncIterator[Event]:
        try:
            for word in ("one", " two", " three"):
                yield TextDelta(0, word)
            yield Finish(0, "stop")
        finally:
            closed.append(True)

    sent: list[bool] = []
    reports: list[tuple[int, list[bool]]] = []

    async def gone_after_two(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.body":
            if len(sent) == 2:
                raise OSError("the client went away")
            sent.append(message["more_body"])

    async def receive() -> dict[str, str]:
        await asyncio.sleep(3600)  # the client says nothing; the failed write ends the stream
        return {"type": "http.disconnect"}

    events = ChatChunker(META, want_logprobs=False).chunks(engine())
    response = await streamed(events, Deadlines(), lambda: reports.append((len(sent), list(closed))))
    await response({"type": "http"}, receive, gone_after_two)
    assert sent == [True, True] and reports == [(2, [True])]
