"""What the relay needs from an HTTP client for its nodes, after httpx's `AsyncBaseTransport`.

The implementation is `http1.Pool` (pooled connections on asyncio's `Protocol`, parsed by httptools): a
general-purpose client (aiohttp, httpx) costs the gateway about half again as much CPU per relayed request
(`docs/benchmarks.md`); tests may hand a fake in its place. Deadlines are loop times
(`loop.time()`), so that the relay can give each stage of an exchange its own.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass
from typing import Protocol
from urllib.parse import unquote, urlsplit

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


@dataclass(frozen=True, slots=True)
class Origin:
    """Where a node's URL points: what to connect to and what to put in each request head."""

    host: str
    port: int
    tls: bool
    base_path: str  # the URL's path without its trailing slash, e.g. "/v1"
    host_header: str
    basic_auth: str | None  # credentials written into the URL, as an Authorization value

    @classmethod
    def parse(cls, url: str) -> Origin:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"not an http(s) URL: {parts.scheme}://{parts.hostname or ''}")
        tls = parts.scheme == "https"
        port = parts.port or (443 if tls else 80)
        host = parts.hostname
        shown = f"[{host}]" if ":" in host else host
        default_port = port == (443 if tls else 80)
        basic = None
        if parts.username is not None:
            secret = f"{unquote(parts.username)}:{unquote(parts.password or '')}".encode()
            basic = "Basic " + base64.b64encode(secret).decode()
        return cls(host, port, tls, parts.path.rstrip("/"), shown if default_port else f"{shown}:{port}", basic)

    def fixed_headers(self, headers: dict[str, str]) -> dict[str, str]:
        """The headers of every request to this node: no compressed bodies (the relay reads them as they come),
        the caller's `headers`, and the URL's credentials unless the caller gave its own."""
        fixed = {"Accept-Encoding": "identity", **headers}
        if self.basic_auth is not None:
            fixed.setdefault("Authorization", self.basic_auth)
        return fixed

    @property
    def base_url(self) -> str:
        """The URL without its credentials or trailing slash, e.g. "http://node:8000/v1"."""
        return f"{'https' if self.tls else 'http'}://{self.host_header}{self.base_path}"
