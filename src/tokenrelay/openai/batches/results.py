"""A line's answer as the output and error files hold it, and the tokens it used."""

from __future__ import annotations

from typing import Any

from tokenrelay.jsonbytes import loads
from tokenrelay.store.batches import ClaimedLine, LineResult
from tokenrelay.store.ids import time_ordered_id

_STOPPED = {
    "expired": ("batch_expired", "This request could not be executed before the completion window expired."),
    "cancelled": ("batch_cancelled", "This request was not executed: the batch was cancelled."),
}


def line_result(line: ClaimedLine, request_id: str, status: int, raw: bytes) -> LineResult:
    try:
        body: Any = loads(raw)
    except ValueError:
        body = {"error": {"message": raw.decode("utf-8", "replace"), "type": "server_error"}}
    result = {
        "id": f"batch_req_{time_ordered_id()}",
        "custom_id": line.custom_id,
        "response": {"status_code": status, "request_id": request_id, "body": body},
        "error": None,
    }
    tokens = _tokens(body) if status < 400 else (0, 0, 0, 0)
    return LineResult(status, result, *tokens)


def stopped_line(line: dict[str, Any], state: str) -> dict[str, Any]:
    """The error file's line for a line the batch's end left unrun."""
    code, message = _STOPPED[state]
    return {
        "id": f"batch_req_{time_ordered_id()}",
        "custom_id": line["custom_id"],
        "response": None,
        "error": {"code": code, "message": message},
    }


def _tokens(body: Any) -> tuple[int, int, int, int]:
    """(input, cached input, output, reasoning) tokens from an answer's `usage`, in any endpoint's words."""
    usage = body.get("usage") if isinstance(body, dict) else None
    if not isinstance(usage, dict):
        return 0, 0, 0, 0
    prompt = usage.get("prompt_tokens", usage.get("input_tokens", 0)) or 0
    output = usage.get("completion_tokens", usage.get("output_tokens", 0)) or 0
    details = usage.get("prompt_tokens_details") or usage.get("input_tokens_details") or {}
    output_details = usage.get("completion_tokens_details") or usage.get("output_tokens_details") or {}
    reasoning = output_details.get("reasoning_tokens") or 0
    return int(prompt), int(details.get("cached_tokens") or 0), int(output), int(reasoning)
