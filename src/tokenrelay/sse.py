"""Server-sent events: chunk dicts → `data:` frames, an error event after the first byte, always `[DONE]`."""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator
from typing import Any

from starlette.responses import StreamingResponse

from tokenrelay.errors import APIError

log = logging.getLogger(__name__)

DONE = b"data: [DONE]\n\n"


def dumps(body: dict[str, Any]) -> str:
    return json.dumps(body, ensure_ascii=False, separators=(",", ":"))


def frame(body: dict[str, Any]) -> bytes:
    return f"data: {dumps(body)}\n\n".encode()


async def frames(chunks: AsyncIterator[dict[str, Any]]) -> AsyncIterator[bytes]:
    """Frames every chunk; an error after the stream started becomes one error event, then `[DONE]`."""
    try:
        async for chunk in chunks:
            yield frame(chunk)
    except APIError as exc:
        yield frame(exc.body())
    except Exception:
        log.exception("stream failed after the first byte")
        yield frame(APIError("The server failed while streaming the response.").body())
    yield DONE


async def stream_response(
    chunks: AsyncIterator[dict[str, Any]], first: dict[str, Any] | None, headers: dict[str, str]
) -> StreamingResponse:
    async def body() -> AsyncIterator[bytes]:
        if first is not None:
            yield frame(first)
        async for data in frames(chunks):
            yield data

    stream_headers = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no", **headers}
    return StreamingResponse(body(), media_type="text/event-stream", headers=stream_headers)
