"""The uvicorn options every way of serving shares (one process, or the supervisor of several workers)."""

from __future__ import annotations

from typing import Any

from tokenrelay.config import Settings
from tokenrelay.server.write_batching import TurnBufferedHttpToolsProtocol


def uvicorn_options(settings: Settings) -> dict[str, Any]:
    # log_config=None: uvicorn's own loggers go through ours, so `--log-format json` covers them too.
    # http: uvicorn's httptools protocol, writing each loop turn's bytes together (`server.write_batching`).
    return {
        "http": TurnBufferedHttpToolsProtocol,
        "host": settings.host,
        "port": settings.port,
        "log_level": settings.log_level.lower(),
        "log_config": None,
        "access_log": False,
        # uvicorn's X-Forwarded-* middleware rewrites each request's client address and scheme; tokenrelay
        # reads neither (no access log, no absolute URLs), so the layer would only cost every request a call.
        "proxy_headers": False,
        "timeout_graceful_shutdown": settings.shutdown_timeout,
    }
