"""The Messages stream's framing: `event:` + `data:` per event, an `error` event after the first byte, no end marker."""

from __future__ import annotations

from tokenrelay.anthropic.messages.errors import error_body
from tokenrelay.errors import APIError
from tokenrelay.jsonbytes import dumps
from tokenrelay.openai.render import Chunk


def event_frame(chunk: Chunk) -> bytes:
    return b"event: " + str(chunk["type"]).encode() + b"\ndata: " + dumps(chunk) + b"\n\n"


class MessagesFraming:
    """Anthropic's SSE: every event's `type` is also its `event:` name; the stream ends with `message_stop`."""

    def frames(self, chunks: list[Chunk]) -> bytes:
        return b"".join([event_frame(chunk) for chunk in chunks])

    def error(self, exc: APIError) -> bytes:
        return event_frame(error_body(exc))

    def end(self) -> bytes:
        return b""
