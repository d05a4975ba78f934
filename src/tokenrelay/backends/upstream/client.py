"""The HTTP client of one node: its transport's pooled connections, carrying the node's key."""

from __future__ import annotations

import asyncio
import logging

from tokenrelay import __version__
from tokenrelay.backends.upstream.http1 import Pool
from tokenrelay.backends.upstream.transport import NodeReply, TransportError, TransportFactory
from tokenrelay.config import UpstreamSettings, UpstreamTimeouts

log = logging.getLogger(__name__)


class NodeClient:
    """One node's connections. The relay sets each stage's deadline (per chunk, keep-alive comments
    excluded); the transport keeps them, and its own limit on connecting."""

    def __init__(
        self, settings: UpstreamSettings, timeouts: UpstreamTimeouts, transport: TransportFactory = Pool
    ) -> None:
        headers = {"User-Agent": f"tokenrelay/{__version__}", "Content-Type": "application/json"}
        if settings.api_key is not None:
            headers["Authorization"] = f"Bearer {settings.api_key.get_secret_value()}"
        self.name = settings.label
        self.transport = transport(settings.url, headers, timeouts.connect)

    async def post(self, path: str, payload: bytes, headers: dict[str, str], deadline: float) -> NodeReply:
        """Send a request; returns once the node's status line and headers are in (by `deadline`, loop time)."""
        return await self.transport.request("POST", path, payload, headers, deadline)

    async def request(
        self, method: str, path: str, headers: dict[str, str], deadline: float, payload: bytes = b""
    ) -> NodeReply:
        """Any request, returned as `post` returns."""
        return await self.transport.request(method, path, payload, headers, deadline)

    async def probe(self, path: str, timeout: float) -> bool:
        try:
            deadline = asyncio.get_running_loop().time() + timeout
            reply = await self.transport.request("GET", path, deadline=deadline)
            try:
                await reply.read(deadline)
            finally:
                reply.release()
            return 200 <= reply.status < 300
        except TransportError as exc:
            log.info("probe of node %s failed: %s", self.name, exc)
            return False

    async def close(self) -> None:
        await self.transport.close()
