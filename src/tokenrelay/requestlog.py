"""One structured log line per request (never the key itself).

The fields ride on the record; `tokenrelay.logsetup` renders them as `key=value` text or merges them into a
JSON object (`--log-format json`).
"""

from __future__ import annotations

import logging
import time

from tokenrelay.calls import Call
from tokenrelay.logstream import LoopTurnHandler

REQUEST_LOGGER = "tokenrelay.requests"
log = logging.getLogger(REQUEST_LOGGER)


def call_fields(call: Call) -> dict[str, object]:
    return {
        "request_id": call.request_id,
        "key": call.key_name,
        "endpoint": call.endpoint,
        "model": call.model,
        "backend": call.backend or None,
        "node": call.node,
        "stream": call.streamed,
        "status": call.status,
        "error": call.error,
        "finish": ",".join(call.finish_reasons) or None,
        "prompt_tokens": call.usage.prompt_tokens,
        "completion_tokens": call.usage.completion_tokens,
        "cached_tokens": call.usage.cached_tokens,
        "usage_estimated": call.usage.estimated or None,
        "ttft_ms": None if call.ttft is None else round(call.ttft * 1000, 1),
        "latency_ms": round(call.latency * 1000, 1),
    }


def log_call(call: Call, worker: int | None = None) -> None:
    """`worker`: the pid of the process that served the call, when several share the port."""
    if not log.isEnabledFor(logging.INFO):
        return
    fields = call_fields(call)
    if worker is not None:
        fields["worker"] = worker
    handler = _direct_handler()
    line = getattr(handler.formatter, "request_line", None) if handler is not None else None
    if handler is None or line is None:
        log.info("request", extra={"fields": fields})
        return
    handler.write_deferred(line(REQUEST_LOGGER, time.time(), fields))


def _direct_handler() -> LoopTurnHandler | None:
    """The one handler a request record would reach, when logging is as `configure_logging` left it.

    A request line through `logging` made a record, walked the logger tree and the handler's filters and
    formatted through the generic `Formatter` path: about half the line's cost under load (py-spy, 64
    concurrent clients). When the request logger has no handler or filter of its own, nothing between it
    and the root has a handler, and the root's only handler is the `LoopTurnHandler` with one of
    `tokenrelay.logsetup`'s formatters (which have `request_line`: the text `format` makes of such a
    record), that line is written by the handler as a record's would be. Any other set-up (a test's capture handler, an
    operator's filter or extra handler) takes the standard path."""
    if log.handlers or log.filters or not log.propagate:
        return None
    parent = log.parent
    while parent is not None and parent is not log.root:
        if parent.handlers or not parent.propagate:
            return None
        parent = parent.parent
    handlers = log.root.handlers
    if len(handlers) != 1:
        return None
    handler = handlers[0]
    if type(handler) is not LoopTurnHandler or handler.filters or handler.level > logging.INFO:
        return None
    return handler
