"""The HTTP protocol tokenrelay serves with: uvicorn's (httptools), with each loop turn's writes sent together.

uvicorn writes a response's head when the app sends `http.response.start` and its body when it sends
`http.response.body`: two system calls, and two TCP segments, for every JSON answer. Here the connection's
transport holds what is written during one loop turn and writes it when the turn ends, so a head and body
sent in one turn leave in one write. Nothing waits longer than the turn that wrote it; a `close` writes what
is held first; an `abort` drops it, as the transport itself would.

uvicorn has no setting for this; it takes a protocol class as its `http` setting, and this one hands uvicorn's
own protocol a wrapped transport in `connection_made` (asyncio's `Protocol` interface). Everything but the
writes goes straight to the socket's transport (flow control included: at most one turn's bytes are held here
before the transport sees them).
"""

from __future__ import annotations

import asyncio
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol


class TurnBufferedTransport:
    """A stream transport whose writes during one loop turn reach the wrapped transport as one write."""

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        self._transport = transport
        self._loop = loop
        self._held: list[bytes] = []
        self._held_bytes = 0

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if not data:
            return
        if not self._held:
            self._loop.call_soon(self.flush)
        self._held.append(bytes(data))
        self._held_bytes += len(data)

    def writelines(self, lines: Any) -> None:
        for data in lines:
            self.write(data)

    def flush(self) -> None:
        """Hand what is held to the wrapped transport (a closed connection's bytes go nowhere, as before)."""
        held, self._held, self._held_bytes = self._held, [], 0
        if held and not self._transport.is_closing():
            self._transport.write(b"".join(held))

    def write_eof(self) -> None:
        self.flush()
        self._transport.write_eof()

    def close(self) -> None:
        self.flush()
        self._transport.close()

    def abort(self) -> None:
        self._held, self._held_bytes = [], 0
        self._transport.abort()

    def get_write_buffer_size(self) -> int:
        return self._transport.get_write_buffer_size() + self._held_bytes

    def __getattr__(self, name: str) -> Any:
        # Reading, flow control, addresses and socket options belong to the wrapped transport.
        return getattr(self._transport, name)


class TurnBufferedHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol over a `TurnBufferedTransport` (pass as uvicorn's `http` setting)."""

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        buffered = TurnBufferedTransport(transport, asyncio.get_running_loop())
        super().connection_made(buffered)  # type: ignore[arg-type]
