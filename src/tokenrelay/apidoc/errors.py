"""The error bodies the API answers with, as schemas for the document, and the responses that declare them."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel

# What each status means on this server (the description of its response in the document).
MEANING = {
    400: "The request is invalid; `param` names the field.",
    401: "No key, or a key that is unknown, revoked or expired.",
    403: "The key may not use this endpoint.",
    404: "No such model, object or path for this key.",
    409: "The request conflicts with the current state (a name that is taken, a revoked key).",
    413: "The request body is too large.",
    429: "The key's rate limit or token budget is used up.",
    500: "The server had an error while processing the request.",
    502: "No upstream node could serve the request.",
    503: "The server cannot take the request now (starting, overloaded, shutting down); retry later.",
    529: "The server is overloaded; retry later.",
}


class OpenAIErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None
    code: str | None


class OpenAIError(BaseModel):
    """The OpenAI error body every route but the Messages API answers with."""

    error: OpenAIErrorDetail


class AnthropicErrorDetail(BaseModel):
    type: str
    message: str


class AnthropicError(BaseModel):
    """Anthropic's error body, on `/v1/messages` and `/v1/messages/count_tokens`."""

    type: Literal["error"]
    error: AnthropicErrorDetail


def error_responses(*statuses: int, body: type[BaseModel] = OpenAIError) -> dict[int | str, dict[str, Any]]:
    """FastAPI `responses=` entries declaring each status with the error body."""
    return {status: {"model": body, "description": MEANING[status]} for status in statuses}
