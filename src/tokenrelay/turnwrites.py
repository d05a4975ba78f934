"""The HTTP protocol tokenrelay serves with: uvicorn's (httptools), with each loop turn's writes sent together.

uvicorn writes a response's status line and headers the moment the app sends `http.response.start`, and the
body when it sends `http.response.body`: two system calls, and two TCP segments for the client to take in,
for every JSON answer, and a separate one for the head of every stream. On loopback against the
benchmark's mock node that was about a seventh of a relayed request's CPU (`benchmarks/gateway.py`,
concurrency 64: 350 -> 303 us per JSON request, 514 -> 436 per stream). Here the connection's transport holds
what is written during one turn of the event loop and writes it at the end of that turn (`call_soon`), so
the head and the body that follow each other in one turn leave in one write. Nothing waits longer than
the turn that wrote it; a `close` writes what is held first; an `abort` drops it, as the transport itself
would.

uvicorn has no setting for this, so the transport is wrapped when the connection is made; everything but
the writes goes straight to uvicorn's own transport (flow control included: at most one turn's bytes are
held here before the transport sees them).

All the connections of one server flush together, through one `TurnFlush`: one loop callback for the
turn's writes, which then leave in one burst rather than spread among the next turn's other work, so a
client takes several answers in one wake-up (the same set-up, two workers, five paired rounds: 217 -> 200 us
of CPU per JSON request, 275 -> 271 us per stream). The node client writes its requests the same way
(`backends/upstream/http1.py`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

log = logging.getLogger(__name__)


class TurnFlush:
    """Flushes due at the start of the next loop turn, run together from one loop callback."""

    def __init__(self) -> None:
        self._due: list[Callable[[], None]] = []
        self._loop: asyncio.AbstractEventLoop | None = None  # the loop the pending callback is on

    def soon(self, flush: Callable[[], None]) -> None:
        """Run `flush` at the start of the next turn of the running loop."""
        if not self._due or not self._loop.is_running():  # type: ignore[union-attr]  # set with the first due
            # A loop that stopped with flushes due (a test's loop, ended mid-exchange) never runs its callback:
            # what it held belongs to that loop's connections, and this loop gets a callback of its own.
            self._due = []
            self._loop = asyncio.get_running_loop()
            self._loop.call_soon(self._run)
        self._due.append(flush)

    def _run(self) -> None:
        due, self._due = self._due, []
        for flush in due:
            try:
                flush()
            except Exception:  # one connection's failure must not hold back the others' bytes
                log.exception("a held write failed")


class TurnBufferedTransport:
    """A stream transport whose writes during one loop turn reach the wrapped transport as one write."""

    def __init__(self, transport: asyncio.Transport, flushes: TurnFlush) -> None:
        self._transport = transport
        self._flushes = flushes
        self._held: list[bytes] = []
        self._held_bytes = 0

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if not data:
            return
        if not self._held:
            self._flushes.soon(self.flush)
        self._held.append(bytes(data))
        self._held_bytes += len(data)

    def writelines(self, lines: Any) -> None:
        for data in lines:
            self.write(data)

    def flush(self) -> None:
        """Hand what is held to the wrapped transport (a closed connection's bytes go nowhere, as before)."""
        held, self._held, self._held_bytes = self._held, [], 0
        if held and not self._transport.is_closing():
            self._transport.write(held[0] if len(held) == 1 else b"".join(held))

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

    def is_closing(self) -> bool:
        # Asked once per response by uvicorn; through `__getattr__` it would cost a failed lookup first.
        return self._transport.is_closing()

    def __getattr__(self, name: str) -> Any:
        # Reading, flow control, addresses and socket options belong to the wrapped transport.
        return getattr(self._transport, name)


class TurnBufferedHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol over a `TurnBufferedTransport` (pass as uvicorn's `http` setting)."""

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)  # addresses and flow control are read from the real transport
        self.transport = TurnBufferedTransport(transport, _server_flush(self))  # type: ignore[assignment]


def _server_flush(protocol: HttpToolsProtocol) -> TurnFlush:
    """The `TurnFlush` of the protocol's server, kept on uvicorn's state object for the server's connections
    (one per server and so per worker process; uvicorn gives protocols nothing else they share)."""
    state = protocol.server_state
    flushes = getattr(state, "tokenrelay_turn_flush", None)
    if flushes is None:
        flushes = TurnFlush()
        state.tokenrelay_turn_flush = flushes  # type: ignore[attr-defined]
    return flushes
