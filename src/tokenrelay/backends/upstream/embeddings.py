"""An embedding request as a node receives it, and the node's answer as `Embeddings`.

The node gets the client's `input` and `user` as sent, with `model` rewritten to the node's name. It is asked
for plain floats: `encoding_format` and `dimensions` are the gateway's to apply (the same way for every
backend of a model, per its settings), so a node that knows neither still serves the request.
"""

from __future__ import annotations

import base64
from typing import Any

import numpy as np

from tokenrelay.backends.base import Embeddings, Vector
from tokenrelay.backends.tokens import TokenCounter, text_tokens
from tokenrelay.backends.upstream.failures import NodeFailure
from tokenrelay.protocol.embeddings import EmbeddingRequest

_GATEWAY_FIELDS = {"encoding_format", "dimensions"}


def embedding_body(request: EmbeddingRequest, node_model: str) -> dict[str, Any]:
    body = request.model_dump(mode="json", exclude_unset=True, exclude=_GATEWAY_FIELDS)
    body["model"] = node_model
    return body


def embeddings_of(answer: dict[str, Any], request: EmbeddingRequest, counter: TokenCounter) -> Embeddings:
    """The node's vectors in input order (by their `index`) and its prompt token count (estimated when it gave
    none). An answer that does not fit the request is the node's failure."""
    data = answer.get("data")
    expected = len(request.inputs)
    if not isinstance(data, list) or len(data) != expected:
        raise NodeFailure(f"the node's answer does not hold {expected} embedding(s)")
    vectors: list[Vector | None] = [None] * expected
    for position, item in enumerate(data):
        index = item.get("index", position) if isinstance(item, dict) else None
        if not isinstance(index, int) or not 0 <= index < expected or vectors[index] is not None:
            raise NodeFailure("the node's answer has a missing or repeated embedding index")
        vectors[index] = _vector(item.get("embedding"))
    usage = answer.get("usage")
    tokens = usage.get("prompt_tokens") if isinstance(usage, dict) else None
    if isinstance(tokens, int):
        return Embeddings([v for v in vectors if v is not None], prompt_tokens=tokens)
    estimate = sum(text_tokens(i, counter) for i in request.inputs)
    return Embeddings([v for v in vectors if v is not None], prompt_tokens=estimate, estimated=True)


def _vector(value: Any) -> Vector:
    """A JSON list of numbers, or little-endian float32 in base64 (what a node that ignores the asked format
    may send)."""
    if isinstance(value, str):
        try:
            raw = base64.b64decode(value, validate=True)
        except ValueError:
            raise NodeFailure("the node sent an embedding that is not valid base64") from None
        if len(raw) % 4:
            raise NodeFailure("the node sent a base64 embedding that is not float32")
        return np.frombuffer(raw, dtype="<f4").astype(np.float32)
    if isinstance(value, list) and value and all(isinstance(x, int | float) and not isinstance(x, bool) for x in value):
        return np.asarray(value, dtype=np.float32)
    raise NodeFailure("the node sent an embedding that is not a list of numbers")
