"""The `/v1/embeddings` answer's shape, for the OpenAPI schema (`render` builds the bodies themselves).

The request model is `tokenrelay.protocol.embeddings.EmbeddingRequest`: the backends receive it, so it sits
below the API layer with the other request models.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel


class EmbeddingObject(BaseModel):
    object: Literal["embedding"] = "embedding"
    index: int
    embedding: list[float] | str  # a string: little-endian float32, base64-encoded


class EmbeddingUsage(BaseModel):
    prompt_tokens: int
    total_tokens: int


class EmbeddingList(BaseModel):
    """The answer: one entry per input, in input order."""

    object: Literal["list"] = "list"
    data: list[EmbeddingObject]
    model: str
    usage: EmbeddingUsage
