"""The HTTP client of one node: pooled keep-alive connections, the node's key, connect limits."""

from __future__ import annotations

import httpx

from tokenrelay import __version__
from tokenrelay.config import UpstreamSettings, UpstreamTimeouts

# Idle connections kept per node when `max_in_flight` does not bound them: enough for a busy node without
# hoarding sockets.
_KEEPALIVE = 256


def node_client(
    settings: UpstreamSettings, timeouts: UpstreamTimeouts, transport: httpx.AsyncBaseTransport | None = None
) -> httpx.AsyncClient:
    headers = {"User-Agent": f"tokenrelay/{__version__}"}
    if settings.api_key is not None:
        headers["Authorization"] = f"Bearer {settings.api_key.get_secret_value()}"
    cap = settings.max_in_flight
    limits = httpx.Limits(max_connections=cap, max_keepalive_connections=min(cap or _KEEPALIVE, _KEEPALIVE))
    # Read limits are enforced per chunk by the relay (keep-alive comments must not reset them), so httpx
    # only bounds connecting, writing and waiting for a pooled connection.
    timeout = httpx.Timeout(connect=timeouts.connect, read=None, write=timeouts.connect, pool=timeouts.first_byte)
    return httpx.AsyncClient(
        base_url=settings.url.rstrip("/"), headers=headers, timeout=timeout, limits=limits, transport=transport
    )
