"""The node transport on aiohttp's client: one pooled session per node, bodies handed over as they arrive.

aiohttp's errors are turned into the interface's (`transport.py`), and each wait is bounded by the deadline
the relay gives, with `asyncio.timeout_at`; aiohttp's own timeout covers connecting only.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import TypeVar

import aiohttp

from tokenrelay.backends.upstream.transport import (
    KEEPALIVE_SECONDS,
    ConnectFailed,
    ConnectionLost,
    Origin,
    ReadTimeout,
)

T = TypeVar("T")


class AiohttpReply:
    """A node's answer, read through aiohttp's response."""

    __slots__ = ("_at_end", "_response")

    def __init__(self, response: aiohttp.ClientResponse) -> None:
        self._response = response
        self._at_end = False

    @property
    def status(self) -> int:
        return self._response.status

    @property
    def content_type(self) -> str:
        return self._response.content_type.lower()

    async def read(self, deadline: float | None = None) -> bytes:
        parts = []
        while (piece := await self.next_piece(deadline)) is not None:
            parts.append(piece)
        return b"".join(parts)

    async def next_piece(self, deadline: float | None = None) -> bytes | None:
        if self._at_end:
            return None
        piece = await _bounded(self._response.content.readany(), deadline)
        if not piece:
            self._at_end = True
            return None
        return piece

    def release(self) -> None:
        if self._at_end:
            self._response.release()  # back to the pool, if the node keeps the connection alive
        else:
            self._response.close()  # left mid-way: the connection is closed, so the node stops generating


class AiohttpTransport:
    """A node's connections (a `transport.NodeTransport`) in one `aiohttp.ClientSession`.

    The session is made on the first request: aiohttp binds it to the running loop, and a node's settings
    are read before the server's loop runs."""

    def __init__(
        self, url: str, headers: dict[str, str], connect_timeout: float, keepalive: float = KEEPALIVE_SECONDS
    ) -> None:
        self.origin = Origin.parse(url)
        self.connect_timeout = connect_timeout
        self.keepalive = keepalive
        self.headers = self.origin.fixed_headers(headers)
        self._session: aiohttp.ClientSession | None = None

    async def request(
        self,
        method: str,
        path: str,
        body: bytes = b"",
        headers: dict[str, str] | None = None,
        deadline: float | None = None,
    ) -> AiohttpReply:
        url = self.origin.base_url + path
        data = body if method != "GET" else None
        response = await _bounded(self._client().request(method, url, data=data, headers=headers), deadline)
        return AiohttpReply(response)

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=0, keepalive_timeout=self.keepalive),
                headers=self.headers,
                timeout=aiohttp.ClientTimeout(total=None, connect=self.connect_timeout),
                cookie_jar=aiohttp.DummyCookieJar(),  # a node's cookies are not ours to keep
                auto_decompress=False,
            )
        return self._session


async def _bounded(waiting: Awaitable[T], deadline: float | None) -> T:
    """`waiting`'s result by `deadline` (loop time; None: no limit), aiohttp's errors as the interface's."""
    try:
        async with asyncio.timeout_at(deadline):
            return await waiting
    except aiohttp.ClientConnectorError as exc:
        raise ConnectFailed(f"connection failed ({type(exc.os_error).__name__})") from None
    except aiohttp.ConnectionTimeoutError:  # aiohttp's limit on connecting: a TimeoutError, so caught first
        raise ConnectFailed("connection timed out") from None
    except TimeoutError:
        raise ReadTimeout("the deadline passed") from None
    except aiohttp.ClientResponseError as exc:  # what aiohttp raises for an answer its parser refuses
        raise ConnectionLost(f"the node's answer is not valid HTTP ({exc.message})") from None
    except (aiohttp.ClientError, OSError) as exc:
        raise ConnectionLost(f"the node's connection broke ({type(exc).__name__})") from None
