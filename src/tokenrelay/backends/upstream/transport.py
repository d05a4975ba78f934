"""What the relay needs from an HTTP client for its nodes, after httpx's `AsyncBaseTransport`.

The implementation is `http1.Pool` (pooled connections on asyncio's `Protocol`, parsed by httptools): a
general-purpose client (aiohttp, httpx) costs the gateway about half again as much CPU per relayed request
(`docs/benchmarks.md`); tests may hand a fake in its place. Deadlines are loop times
(`loop.time()`), so that the relay can give each stage of an exchange its own.
"""

from __future__ import annotations

from typing import Protocol

# Idle connections are dropped before common servers drop them (uvicorn, so vLLM and SGLang: 5 s), so a
# request is not sent down a connection the node is closing.
KEEPALIVE_SECONDS = 4.0


class TransportError(Exception):
    """The exchange failed below HTTP: no connection, a dropped one, or bytes that are not HTTP."""


class ConnectFailed(TransportError):
    pass


class ConnectionLost(TransportError):
    pass


class ReadTimeout(TransportError):
    """The deadline the caller gave passed first."""


class NodeReply(Protocol):
    """A node's answer: status and headers at once, the body as it arrives."""

    @property
    def status(self) -> int: ...

    @property
    def content_type(self) -> str:
        """The media type alone, lower-cased (no parameters)."""
        ...

    async def read(self, deadline: float | None = None) -> bytes:
        """The whole body, by `deadline` if one is given."""
        ...

    async def next_piece(self, deadline: float | None = None) -> bytes | None:
        """The bytes that arrived since the last call (waiting for some until `deadline`), or None at the end."""
        ...

    def release(self) -> None:
        """Done with the answer. The connection is reused only if the body was read to its end; otherwise it is
        closed, which is also how a node learns that the client of an abandoned generation has gone."""
        ...


class NodeTransport(Protocol):
    """One node's pooled connections."""

    async def request(
        self,
        method: str,
        path: str,
        body: bytes = b"",
        headers: dict[str, str] | None = None,
        deadline: float | None = None,
    ) -> NodeReply:
        """Send a request to the node's URL + `path`; returns once the status line and headers are in, by
        `deadline` if one is given (connecting counts too). The caller must `release()` the reply."""
        ...

    async def close(self) -> None: ...


class TransportFactory(Protocol):
    """Makes a node's transport from its URL, the headers of every request and the limit on connecting."""

    def __call__(self, url: str, headers: dict[str, str], connect_timeout: float) -> NodeTransport: ...
