"""The HTTP client of one node: pooled keep-alive connections carrying the node's key.

aiohttp rather than httpx, for speed on the hot path. Measured here against the benchmark's mock node
(2 cores): httpx 0.28 made about 720 requests/s one at a time and 480/s with 64 concurrent (its pool's
bookkeeping grows with connections times waiters); aiohttp made about 2,650 and 3,950.
"""

from __future__ import annotations

import logging

import aiohttp

from tokenrelay import __version__
from tokenrelay.config import UpstreamSettings, UpstreamTimeouts

log = logging.getLogger(__name__)

# Idle connections are dropped before common servers drop them (uvicorn, so vLLM and SGLang: 5 s), so a
# request is not sent down a connection the node is closing.
_KEEPALIVE_SECONDS = 4.0


class NodeClient:
    """One node's session, made on first use (aiohttp sessions belong to the running event loop)."""

    def __init__(self, settings: UpstreamSettings, timeouts: UpstreamTimeouts) -> None:
        self.base = settings.url.rstrip("/")
        self.headers = {"User-Agent": f"tokenrelay/{__version__}", "Content-Type": "application/json"}
        if settings.api_key is not None:
            self.headers["Authorization"] = f"Bearer {settings.api_key.get_secret_value()}"
        self.limit = settings.max_in_flight or 0  # 0: unbounded; the router enforces max_in_flight anyway
        self.connect_timeout = timeouts.connect
        self._session: aiohttp.ClientSession | None = None

    @property
    def session(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            connector = aiohttp.TCPConnector(limit=self.limit, limit_per_host=0, keepalive_timeout=_KEEPALIVE_SECONDS)
            # Reading is timed by the relay (per chunk, keep-alive comments excluded); aiohttp only times
            # connecting.
            timeout = aiohttp.ClientTimeout(total=None, sock_connect=self.connect_timeout)
            self._session = aiohttp.ClientSession(
                connector=connector, headers=self.headers, timeout=timeout, cookie_jar=aiohttp.DummyCookieJar()
            )
        return self._session

    async def post(self, path: str, payload: bytes, headers: dict[str, str]) -> aiohttp.ClientResponse:
        """Send a request; returns once the node's status line and headers are in."""
        return await self.session.post(self.base + path, data=payload, headers=headers)

    async def probe(self, path: str, timeout: float) -> bool:
        try:
            async with self.session.get(self.base + path, timeout=aiohttp.ClientTimeout(total=timeout)) as response:
                await response.read()
                return 200 <= response.status < 300
        except (aiohttp.ClientError, TimeoutError) as exc:
            log.info("probe of %s failed: %r", self.base, exc)
            return False

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
