"""The batch object of OpenAI's Batch API, from its row."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from tokenrelay.store.files import epoch

_TIMES = (
    "created_at",
    "in_progress_at",
    "expires_at",
    "finalizing_at",
    "completed_at",
    "failed_at",
    "expired_at",
    "cancelling_at",
    "cancelled_at",
)
EMPTY_USAGE = {
    "input_tokens": 0,
    "input_tokens_details": {"cached_tokens": 0},
    "output_tokens": 0,
    "output_tokens_details": {"reasoning_tokens": 0},
    "total_tokens": 0,
}


def batch_body(row: dict[str, Any]) -> dict[str, Any]:
    times: dict[str, int | None] = {name: _epoch(row[name]) for name in _TIMES}
    return {
        "id": row["id"],
        "object": "batch",
        "endpoint": row["endpoint"],
        "errors": row["errors"],
        "input_file_id": row["input_file_id"],
        "completion_window": row["completion_window"],
        "status": row["status"],
        "output_file_id": row["output_file_id"],
        "error_file_id": row["error_file_id"],
        **times,
        "request_counts": {"total": row["total"], "completed": row["completed"], "failed": row["failed"]},
        "metadata": row["metadata"],
        "usage": row["usage"] or EMPTY_USAGE,
    }


def usage_of(lines: list[dict[str, Any]]) -> dict[str, Any]:
    """The tokens of a batch's answered lines, in the batch object's `usage` shape."""
    done = [line for line in lines if line["state"] == "done"]
    prompt = sum(line["input_tokens"] for line in done)
    output = sum(line["output_tokens"] for line in done)
    return {
        "input_tokens": prompt,
        "input_tokens_details": {"cached_tokens": sum(line["cached_tokens"] for line in done)},
        "output_tokens": output,
        "output_tokens_details": {"reasoning_tokens": sum(line["reasoning_tokens"] for line in done)},
        "total_tokens": prompt + output,
    }


def _epoch(when: datetime | None) -> int | None:
    return None if when is None else epoch(when)
