"""One structured log line per request (never the key itself).

The fields ride on the record; `tokenrelay.observability.logs` renders them as `key=value` text or merges them into a
JSON object (`--log-format json`).
"""

from __future__ import annotations

import logging

from tokenrelay.calls.record import Call
from tokenrelay.observability.logs import REQUEST_LOGGER

log = logging.getLogger(REQUEST_LOGGER)


def call_fields(call: Call) -> dict[str, object]:
    return {
        "request_id": call.request_id,
        "key": call.key_name,
        "endpoint": call.endpoint,
        "model": call.model,
        "served_model": call.served_model,  # a fallback's id, when one served
        "backend": call.backend or None,
        "node": call.node,
        "stream": call.streamed,
        "ignored": ",".join(call.ignored) or None,
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
    log.info("request", extra={"fields": fields})
