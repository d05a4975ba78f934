"""What a node's failure means for the client: try another node, pass the node's answer on, or give up.

Messages built here reach clients, so they name what went wrong but never a node's address or key.
"""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

from tokenrelay.errors import APIError, Overloaded, UpstreamError

# A node's 4xx is the client's problem and goes back as it is, except these: they say the gateway's own
# configuration of the node is wrong (bad node key, wrong path or model name), so another node may serve.
_GATEWAY_FAULT = frozenset({401, 403, 404, 405, 407})
_BUSY = frozenset({429, 503})
_MAX_MESSAGE = 2000


class NodeFailure(Exception):
    """A node could not serve a request; another node may. `reason` is short and free of addresses."""

    def __init__(self, reason: str, *, busy: bool = False) -> None:
        super().__init__(reason)
        self.reason = reason
        self.busy = busy


class NodeRejection(APIError):
    """A node's own 4xx, relayed with its status, message, type, param and code."""

    def __init__(self, status: int, error: dict[str, Any]) -> None:
        super().__init__(
            str(error.get("message") or f"The request was rejected (HTTP {status})."),
            param=_text_or_none(error.get("param")),
            code=_text_or_none(error.get("code")),
            status=status,
        )
        self.type = _text_or_none(error.get("type")) or "invalid_request_error"


def failure_for_status(status: int, content: bytes) -> NodeFailure | NodeRejection:
    if status >= 500 or status in _BUSY or status == 408:
        return NodeFailure(f"HTTP {status}", busy=status in _BUSY)
    if status in _GATEWAY_FAULT:
        return NodeFailure(f"HTTP {status} (node configuration)")
    return NodeRejection(status, node_error(content, status))


def node_error(content: bytes, status: int) -> dict[str, Any]:
    """The `error` object of a node's answer, whatever shape the node used (OpenAI, FastAPI, TGI, plain text)."""
    try:
        body = json.loads(content)
    except ValueError:
        text = content.decode("utf-8", errors="replace").strip()
        return {"message": text[:_MAX_MESSAGE] or None}
    if isinstance(body, dict):
        error = body.get("error")
        if isinstance(error, dict):
            return error
        if isinstance(error, str):
            return {"message": error, "type": body.get("error_type")}
        if "detail" in body:
            detail = body["detail"]
            return {"message": detail if isinstance(detail, str) else json.dumps(detail)[:_MAX_MESSAGE]}
        if isinstance(body.get("message"), str):
            return {"message": body["message"]}
    return {"message": None, "code": str(status)}


def exhausted(failures: list[NodeFailure]) -> APIError:
    """The error for a request no node could serve: 503 when every node was busy, 502 otherwise."""
    if not failures:
        return Overloaded("No upstream node is available for this model right now; retry later.")
    summary = ", ".join(f"{reason} x{count}" if count > 1 else reason for reason, count in _reasons(failures))
    tried = f"tried {len(failures)} node{'s' if len(failures) > 1 else ''}: {summary}"
    if all(f.busy for f in failures):
        return Overloaded(f"Every upstream node for this model is busy ({tried}); retry later.")
    return UpstreamError(f"No upstream node could serve the request ({tried}).")


def broken_stream(reason: str) -> UpstreamError:
    return UpstreamError(f"The upstream node failed while streaming the response ({reason}).")


def _reasons(failures: list[NodeFailure]) -> list[tuple[str, int]]:
    return list(Counter(f.reason for f in failures).items())


def _text_or_none(value: Any) -> str | None:
    return None if value is None else str(value)
