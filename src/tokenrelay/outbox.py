"""The frames of one streamed response that go out to the client together.

A node under load, or a fast one, delivers several chunks in one read; sending each as its own ASGI
message costs a pass through the server's `send` and a socket write per chunk, about a quarter of a
streamed relay's CPU (measured with `benchmarks/gateway.py`'s mock node). A producer that knows when it
is about to wait (the upstream relay, before it reads from the node again) marks the outbox `paced` and
flushes it before each wait; the response then holds frames until the flush, so each node read becomes
one write. A producer that never says so (the embedded engine, one token at a time) gets every frame
sent at once, as before.
"""

from __future__ import annotations

from contextvars import ContextVar

from starlette.types import Send

# The outbox of the stream being served by the current task: set before the backend starts producing, so
# the producer finds it however many layers (failover, metering, rendering) sit between the two.
current_outbox: ContextVar[Outbox | None] = ContextVar("tokenrelay_current_outbox", default=None)


class Outbox:
    def __init__(self) -> None:
        self.paced = False  # the producer flushes before it waits, so frames may be held until then
        self.gone = False  # a write failed: the client went away (uvicorn itself drops writes after that)
        self._parts: list[bytes] = []
        self._send: Send | None = None

    def attach(self, send: Send) -> None:
        """The response has started; frames can go out from now on."""
        self._send = send

    async def put(self, frame: bytes) -> None:
        self._parts.append(frame)
        if not self.paced:
            await self.flush()

    async def flush(self) -> None:
        """Send what is held. Before the response starts there is nothing to send (the first frames wait
        for the response's start, which happens once failover has settled on a node)."""
        if self._parts and self._send is not None:
            parts, self._parts = self._parts, []
            await self._write(parts[0] if len(parts) == 1 else b"".join(parts))

    async def close(self) -> None:
        """The stream is over: what is held goes out with the end of the body, in one message."""
        parts, self._parts = self._parts, []
        await self._write(b"".join(parts), more=False)

    async def _write(self, data: bytes, more: bool = True) -> None:
        assert self._send is not None  # `put` is only called by the response, after `attach`
        if self.gone:
            return
        try:
            await self._send({"type": "http.response.body", "body": data, "more_body": more})
        except OSError:
            self.gone = True
