"""Pieces chat and completions render the same way: the fields every body and chunk repeats, a chunk's frame and
the usage object."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tokenrelay.backends.base import Usage


@dataclass(slots=True)
class ResponseMeta:
    """Fields every response and chunk of one request repeats."""

    id: str
    created: int
    model: str
    system_fingerprint: str
    choices: int
    include_usage: bool = False
    service_tier: str | None = None


def chunk_body(
    meta: ResponseMeta, object_name: str, choices: list[dict[str, Any]], usage: dict[str, Any] | None, **extra: Any
) -> dict[str, Any]:
    """One stream chunk: the fields every chunk repeats, its choices, and `usage` (null but for the last
    chunk) only when the client asked for usage in the stream."""
    body: dict[str, Any] = {
        "id": meta.id,
        "object": object_name,
        "created": meta.created,
        "model": meta.model,
        "system_fingerprint": meta.system_fingerprint,
        **extra,
        "choices": choices,
    }
    if meta.include_usage:
        body["usage"] = usage
    return body


def usage_body(usage: Usage) -> dict[str, Any]:
    # The reference pages require every detail object, so zeros are sent where a count does not apply.
    return {
        "prompt_tokens": usage.prompt_tokens,
        "completion_tokens": usage.completion_tokens,
        "total_tokens": usage.total_tokens,
        "prompt_tokens_details": {"cached_tokens": usage.cached_tokens, "audio_tokens": 0},
        "completion_tokens_details": {
            "reasoning_tokens": usage.reasoning_tokens,
            "audio_tokens": 0,
            "accepted_prediction_tokens": 0,
            "rejected_prediction_tokens": 0,
        },
    }
