"""How a streamed answer's frames are grouped into writes to the client: the frames of one backend event
(the texts of one node read, or one token of the embedded engine) go out as one ASGI message."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from upstream_fakes import (
    ON_ASYNCIO,
    FakeNodes,
    Stream,
    chat,
    chunk,
    nodes_fixture,
    sse,
    usage_chunk,
)

from tokenrelay.api.lifecycle import Ending, streamed
from tokenrelay.api.sse import OPENAI
from tokenrelay.backends.base import Events, Finish, TextDelta, Ticket
from tokenrelay.openai.chat.render import ChatChunker
from tokenrelay.openai.render import ResponseMeta

pytestmark = ON_ASYNCIO
nodes = nodes_fixture()

META = ResponseMeta(id="chatcmpl-1", created=0, model="m", system_fingerprint="fp", choices=1)


async def writes_of(events: AsyncIterator[Events]) -> list[list[bytes]]:
    """Serve the events as an SSE response; the frames of each body message, in order (the last one ends the
    body). The call is reported once, after the last body message."""
    bodies: list[dict[str, Any]] = []
    reports: list[int] = []  # the number of body messages sent when the call was reported
    done = asyncio.Event()

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.body":
            bodies.append(message)
            if not message["more_body"]:
                done.set()

    async def receive() -> dict[str, str]:
        await done.wait()  # what a server answers a pending receive once the response is complete
        return {"type": "http.disconnect"}

    response = Ending(
        await streamed(ChatChunker(META, want_logprobs=False).chunks(events), OPENAI, receive),
        lambda: reports.append(len(bodies)),
    )
    await response({"type": "http"}, receive, send)
    assert [m["more_body"] for m in bodies] == [True] * (len(bodies) - 1) + [False]
    assert reports == [len(bodies)]
    return [[f + b"\n\n" for f in m["body"].split(b"\n\n") if f] for m in bodies]


def content(frame: bytes) -> str:
    return frame.decode()


async def test_the_texts_of_one_read_from_a_node_are_one_write(nodes: FakeNodes) -> None:
    first = sse(chunk("", role="assistant"), chunk("a"), chunk("b"), done=False)
    second = sse(chunk("c"), chunk(finish="stop"), usage_chunk(3, 3))
    nodes.on("a", Stream([first, second], pause=0.1).respond)
    writes = await writes_of(nodes.backend("a").chat(chat(stream=True), Ticket("rid")))
    assert [len(w) for w in writes] == [3, 2, 1], writes  # the usage is not asked for: no write of its own
    opening, a, b = writes[0]
    assert '"role":"assistant"' in content(opening) and '"content":"a"' in content(a) and '"content":"b"' in content(b)
    (c, finish), (end,) = writes[1:]
    assert '"content":"c"' in content(c) and '"finish_reason":"stop"' in content(finish) and end == b"data: [DONE]\n\n"


async def test_a_node_sending_chunk_by_chunk_gets_a_write_per_chunk(nodes: FakeNodes) -> None:
    parts = [sse(chunk("", role="assistant"), done=False)] + [sse(chunk(w), done=False) for w in "xyz"]
    nodes.on("a", Stream([*parts, sse(chunk(finish="stop"))], pause=0.05).respond)
    writes = await writes_of(nodes.backend("a").chat(chat(stream=True), Ticket("rid")))
    # The role chunk alone makes no event, so the first write is the opening with "x"; then one per event.
    assert [len(w) for w in writes] == [2, 1, 1, 1, 1]
    assert '"content":"z"' in content(writes[2][0]) and writes[-1] == [b"data: [DONE]\n\n"]


async def test_an_engine_producing_a_token_at_a_time_gets_a_write_per_token() -> None:
    async def engine() -> AsyncIterator[Events]:
        for word in ("one", " two"):
            yield [TextDelta(0, word)]
        yield [Finish(0, "stop")]

    writes = await writes_of(engine())
    # The opening with "one", " two", the finish, and [DONE] in the message that ends the body.
    assert [len(w) for w in writes] == [2, 1, 1, 1]


async def test_a_stream_is_reported_once_after_its_last_write_or_when_the_client_is_gone() -> None:
    """A stream's call is reported once its bytes are out; a client that went away mid-stream still gets its
    call reported, once, with the events closed first (so the call has everything they recorded)."""
    closed: list[bool] = []

    async def engine() -> AsyncIterator[Events]:
        try:
            for word in ("one", " two", " three"):
                yield [TextDelta(0, word)]
            yield [Finish(0, "stop")]
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
    response = Ending(await streamed(events, OPENAI, receive), lambda: reports.append((len(sent), list(closed))))
    await response({"type": "http"}, receive, gone_after_two)
    assert sent == [True, True] and reports == [(2, [True])]
