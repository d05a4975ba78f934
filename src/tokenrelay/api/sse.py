"""Server-sent events: chunk dicts → frames (`data:` for chat and completions, `event:` + `data:` for the Responses
and Messages APIs), an error event after the first byte, and the API's end marker."""

from __future__ import annotations

import logging
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Sequence
from typing import Protocol, TypeVar

from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from tokenrelay.api.collect import Chunk
from tokenrelay.api.disconnect import cancel_on_disconnect
from tokenrelay.backends.base import aclose_quietly
from tokenrelay.calls.record import ClientGone
from tokenrelay.errors import APIError
from tokenrelay.jsonbytes import dumps

log = logging.getLogger(__name__)

DONE = b"data: [DONE]\n\n"
HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


def frame(body: Chunk) -> bytes:
    return b"data: " + dumps(body) + b"\n\n"


def frames(chunks: Sequence[Chunk]) -> bytes:
    return b"".join([frame(chunk) for chunk in chunks])


Piece = TypeVar("Piece")  # what a stream is made of: chunk dicts to frame, or a node's bytes to pass on
Piece_contra = TypeVar("Piece_contra", contravariant=True)


class Framing(Protocol[Piece_contra]):
    """How an API writes its stream: chunks as SSE messages, an error after the first byte, the end."""

    def frames(self, chunks: Sequence[Piece_contra]) -> bytes: ...

    def error(self, exc: APIError) -> bytes: ...

    def end(self) -> bytes: ...


class OpenAIFraming:
    """`data:` lines, the OpenAI error body as a data message, `[DONE]` last."""

    def frames(self, chunks: Sequence[Chunk]) -> bytes:
        return frames(chunks)

    def error(self, exc: APIError) -> bytes:
        return frame(exc.body())

    def end(self) -> bytes:
        return DONE


OPENAI = OpenAIFraming()


def named_frame(body: Chunk) -> bytes:
    """A frame that names its event after the payload's `type`."""
    return b"event: " + str(body["type"]).encode() + b"\ndata: " + dumps(body) + b"\n\n"


class NamedFraming:
    """`event:` + `data:` per payload, the API's own error payload after the first byte, no end marker (the
    Responses and Messages APIs: their last event says the stream is over)."""

    def __init__(self, error_body: Callable[[APIError], Chunk]) -> None:
        self.error_body = error_body

    def frames(self, chunks: Sequence[Chunk]) -> bytes:
        return b"".join([named_frame(chunk) for chunk in chunks])

    def error(self, exc: APIError) -> bytes:
        return named_frame(self.error_body(exc))

    def end(self) -> bytes:
        return b""


class RawFraming:
    """A node's own event stream passed on as it came (a native relay); an error after the first byte is
    written as the API's named `error` event, and the node's stream needs no end of ours."""

    def __init__(self, error_body: Callable[[APIError], Chunk]) -> None:
        self.error_body = error_body

    def frames(self, chunks: Sequence[bytes]) -> bytes:
        return b"".join(chunks)

    def error(self, exc: APIError) -> bytes:
        return named_frame(self.error_body(exc))

    def end(self) -> bytes:
        return b""


async def stream_body(
    first: list[Piece] | None, rest: AsyncIterator[list[Piece]], framing: Framing[Piece]
) -> AsyncGenerator[bytes, None]:
    """The stream's body: the frames of each event as one piece, so one write. An error after the stream
    started becomes one error event. The framing's end (`[DONE]` for OpenAI) is not in it: `EventStream`
    sends it with the response's closing message."""
    if first is not None:
        yield framing.frames(first)
    try:
        async for chunks in rest:
            yield framing.frames(chunks)
    except APIError as exc:
        yield framing.error(exc)
    except Exception:
        log.exception("stream failed after the first byte")
        yield framing.error(APIError("The server failed while streaming the response."))


class EventStream(StreamingResponse):
    """An SSE response of a generation's chunks that stops, cancelling the generation behind it, when the
    client disconnects.

    Starlette's `StreamingResponse` builds it (status, headers, `body_iterator`); it answers as an ASGI app of its
    own rather than through Starlette's `__call__`, which watches for the disconnect with an anyio task group per
    response (dear on the hot path): here one listener task (`cancel_on_disconnect`) does that, and the stream's
    end (`[DONE]`) goes out with the closing message rather than as a message of its own before it."""

    def __init__(self, first: list[Piece] | None, rest: AsyncIterator[list[Piece]], framing: Framing[Piece]) -> None:
        self.body_stream = stream_body(first, rest, framing)
        self.chunks = rest
        self.end = framing.end()
        super().__init__(self.body_stream, media_type="text/event-stream", headers=HEADERS)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            with cancel_on_disconnect(receive):
                await send({"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})
                async for piece in self.body_iterator:
                    await send({"type": "http.response.body", "body": piece, "more_body": True})
                await send({"type": "http.response.body", "body": self.end, "more_body": False})
        except (ClientGone, OSError):
            pass  # the client went away: the generation was cancelled with the stream, or stops below
        finally:
            # Close the generation (nothing to do if it ran to its end), so the call has all it will get.
            await self.body_stream.aclose()
            await aclose_quietly(self.chunks)  # a body closed before it started never reached them
