"""The flow both generation endpoints share: parse, route, run, render as JSON or SSE."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from tokenrelay.backends.base import Event
from tokenrelay.render.common import Collected, ResponseMeta, collect
from tokenrelay.sse import stream_response

ChunkSource = Callable[[AsyncIterator[Event]], AsyncIterator[dict[str, Any]]]


def response_meta(
    request: Request, prefix: str, model: str, fingerprint: str, choices: int, **extra: Any
) -> ResponseMeta:
    return ResponseMeta(
        id=f"{prefix}-{request.state.request_id}",
        created=int(time.time()),
        model=model,
        system_fingerprint=fingerprint,
        choices=choices,
        **extra,
    )


async def streamed(request: Request, chunks: AsyncIterator[dict[str, Any]]) -> Response:
    # Errors raised before the first chunk (validation inside the backend, a full queue) keep their HTTP
    # status; later ones become an SSE error event followed by [DONE].
    first = await anext(chunks, None)
    headers = {"X-Request-ID": request.state.request_id}
    return await stream_response(chunks, first, headers)


async def collected(request: Request, events: AsyncIterator[Event]) -> Collected:
    """Gather a non-streamed response, abandoning the generation if the client goes away."""
    work = asyncio.ensure_future(collect(events))
    gone = asyncio.ensure_future(_disconnected(request))
    try:
        await asyncio.wait({work, gone}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        gone.cancel()
        if not work.done():
            work.cancel()
            await asyncio.gather(work, return_exceptions=True)
    if work.cancelled():
        raise asyncio.CancelledError
    return work.result()


async def _disconnected(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


def json_response(body: dict[str, Any]) -> JSONResponse:
    return JSONResponse(body)
