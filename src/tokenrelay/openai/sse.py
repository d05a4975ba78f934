"""Server-sent events: chunk dicts → frames, an error event after the first byte, then the stream's end.

Chat and completions frame each chunk as one `data:` line and end with `data: [DONE]`; the Responses API
names each event in an `event:` line and has no end marker (its renderer sends its own closing events)."""

from __future__ import annotations

import logging
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from dataclasses import dataclass

from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from tokenrelay.calls.record import ClientGone, aclose_quietly
from tokenrelay.errors import APIError
from tokenrelay.jsonbytes import dumps
from tokenrelay.openai.disconnect import cancel_on_disconnect
from tokenrelay.openai.render import Chunk

log = logging.getLogger(__name__)

DONE = b"data: [DONE]\n\n"
HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


def frame(body: Chunk) -> bytes:
    return b"data: " + dumps(body) + b"\n\n"


def named_frame(body: Chunk) -> bytes:
    """A frame that names its event (the payload's `type`), as the Responses API's streams do."""
    return b"event: " + str(body.get("type", "error")).encode() + b"\ndata: " + dumps(body) + b"\n\n"


@dataclass(frozen=True, slots=True)
class Framing:
    """How one API writes a chunk, and what ends its streams."""

    frame: Callable[[Chunk], bytes]
    end: bytes


CHAT_FRAMING = Framing(frame, DONE)
NAMED_FRAMING = Framing(named_frame, b"")


def frames(chunks: list[Chunk], framing: Framing = CHAT_FRAMING) -> bytes:
    write = framing.frame
    return b"".join([write(chunk) for chunk in chunks])


async def stream_body(
    first: list[Chunk] | None, rest: AsyncIterator[list[Chunk]], framing: Framing = CHAT_FRAMING
) -> AsyncGenerator[bytes, None]:
    """The stream's body: the frames of each event as one piece, so one write. An error after the stream
    started becomes one error event; the framing's end (`[DONE]` for chat) closes the stream either way."""
    if first is not None:
        yield frames(first, framing)
    try:
        async for chunks in rest:
            yield frames(chunks, framing)
    except APIError as exc:
        yield framing.frame(exc.body())
    except Exception:
        log.exception("stream failed after the first byte")
        yield framing.frame(APIError("The server failed while streaming the response.").body())
    if framing.end:
        yield framing.end


class EventStream(StreamingResponse):
    """An SSE response of a generation's chunks that stops, cancelling the generation behind it, when the
    client disconnects; `report` is called once the response is over, however it ended.

    Starlette's own `__call__` watches for the disconnect (on uvicorn's ASGI spec 2.3) with an anyio task
    group per response, far dearer on the hot path than the one listener task of `cancel_on_disconnect`,
    inside which this `__call__` runs Starlette's `stream_response`."""

    def __init__(
        self,
        first: list[Chunk] | None,
        rest: AsyncIterator[list[Chunk]],
        report: Callable[[], None],
        framing: Framing = CHAT_FRAMING,
    ) -> None:
        self.body_stream = stream_body(first, rest, framing)
        self.chunks = rest
        self.report = report
        super().__init__(self.body_stream, media_type="text/event-stream", headers=HEADERS)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            with cancel_on_disconnect(receive):
                await self.stream_response(send)
        except (ClientGone, OSError):
            pass  # the client went away: the generation was cancelled with the stream, or stops below
        finally:
            # Close the generation (nothing to do if it ran to its end), so the call has all it will get.
            await self.body_stream.aclose()
            await aclose_quietly(self.chunks)  # a body closed before it started never reached them
            self.report()
