"""Vectors → the `/v1/embeddings` body: shortened where `dimensions` asks, as floats or base64."""

from __future__ import annotations

import base64
from typing import Any

import numpy as np

from tokenrelay.backends.base import Vector
from tokenrelay.errors import InvalidRequest


def truncated(vector: Vector, dimensions: int) -> Vector:
    """The first `dimensions` components, scaled back to unit length (what OpenAI's `dimensions` does)."""
    if dimensions > len(vector):
        raise InvalidRequest(
            f"dimensions may be at most {len(vector)} for this model, got {dimensions}.", param="dimensions"
        )
    head = vector[:dimensions].astype(np.float64)
    norm = float(np.linalg.norm(head))
    return (head / norm if norm > 0.0 else head).astype(np.float32)


def encoded(vector: Vector, as_base64: bool) -> list[float] | str:
    """Floats (each float32 value written exactly), or its little-endian float32 bytes in base64."""
    if as_base64:
        return base64.b64encode(vector.astype("<f4").tobytes()).decode("ascii")
    return vector.tolist()


def body(model: str, vectors: list[Vector], prompt_tokens: int, as_base64: bool) -> dict[str, Any]:
    data = [
        {"object": "embedding", "index": index, "embedding": encoded(vector, as_base64)}
        for index, vector in enumerate(vectors)
    ]
    usage = {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens}
    return {"object": "list", "data": data, "model": model, "usage": usage}
