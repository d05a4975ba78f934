"""Server-sent events: chunk dicts → `data:` frames, an error event after the first byte, always `[DONE]`."""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any

from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from tokenrelay.calls import aclose_quietly
from tokenrelay.deadlines import Deadlines
from tokenrelay.disconnect import DisconnectWatch
from tokenrelay.errors import APIError
from tokenrelay.jsonbytes import dumps
from tokenrelay.outbox import Outbox
from tokenrelay.render.common import Chunk

log = logging.getLogger(__name__)

DONE = b"data: [DONE]\n\n"


def frame(body: dict[str, Any]) -> bytes:
    return b"data: " + dumps(body) + b"\n\n"


def framed(chunk: Chunk) -> bytes:
    """A chunk's frame; bytes are frames already (see `tokenrelay.render.runs`)."""
    return chunk if type(chunk) is bytes else frame(chunk)  # type: ignore[arg-type]


async def send_frames(first: Chunk | None, chunks: AsyncIterator[Chunk], outbox: Outbox) -> None:
    """Frames `first` and every chunk into `outbox`; an error after the stream started becomes one error event,
    then `[DONE]`. A coroutine putting frames rather than a generator yielding them: one layer less for every
    chunk of every stream to pass through."""
    if first is not None:
        await outbox.put(framed(first))
    try:
        async for chunk in chunks:
            await outbox.put(framed(chunk))
    except APIError as exc:
        await outbox.put(frame(exc.body()))
    except Exception:
        log.exception("stream failed after the first byte")
        await outbox.put(frame(APIError("The server failed while streaming the response.").body()))
    await outbox.put(DONE)


@functools.cache
def _headers() -> tuple[tuple[bytes, bytes], ...]:
    """An event stream's headers, as Starlette's response makes them (content type with its charset)."""
    headers = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
    return tuple(StreamingResponse(iter(()), media_type="text/event-stream", headers=headers).raw_headers)


class EventStream(StreamingResponse):
    """An SSE response that stops (cancelling the generation behind it) as soon as the client disconnects.

    Starlette's own `__call__` watches for the disconnect with a task group per response on uvicorn (ASGI
    spec 2.3); one watcher task (`DisconnectWatch`) does the same for less. Frames go out through an
    `Outbox`, which writes a paced producer's frames once per node read (see `tokenrelay.outbox`). `report`
    is called once the response is over, its last write made or failed."""

    def __init__(
        self,
        chunks: AsyncIterator[Chunk],
        first: Chunk | None,
        outbox: Outbox,
        deadlines: Deadlines,
        report: Callable[[], None],
    ) -> None:
        # Not Starlette's `__init__`: it works out the same three headers from a dict for every stream (about 3
        # us a response here). `_headers` has Starlette make them once; `__call__` (ours) reads no other field.
        self.status_code = 200
        self.background = None
        self.body_iterator = chunks
        self.raw_headers = list(_headers())  # a copy: the response's own id header is added to it
        self.first = first
        self.outbox = outbox
        self.deadlines = deadlines
        self.report = report

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await self._send(receive, send)
        finally:
            # After the last write, however the stream ended. The write's flush was queued on the loop as it was
            # made (`turnwrites`), before the report queues the call's log line, metrics and ledger row
            # (`finished`): the bytes leave first.
            self.report()

    async def _send(self, receive: Receive, send: Send) -> None:
        chunks, outbox = self.body_iterator, self.outbox
        with DisconnectWatch(receive, self.deadlines) as watch:
            try:
                await send({"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})
                outbox.attach(send)
                await send_frames(self.first, chunks, outbox)
            except asyncio.CancelledError:
                if not watch.gone():
                    raise
                return  # the client has gone: the generation was cancelled with this task
            except OSError:
                return  # the client went away while we sent
            finally:
                await aclose_quietly(chunks)  # however it ended, the call behind it has its last events now
        await outbox.close()
