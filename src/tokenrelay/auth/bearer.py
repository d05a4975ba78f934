"""The bearer token of a request (`Authorization: Bearer <key>`), for the API's guard and the admin guard alike."""

from __future__ import annotations

from starlette.requests import HTTPConnection
from starlette.types import Scope


def bearer_token(request: HTTPConnection) -> str | None:
    return bearer_of(request.headers.get("authorization", ""))


def scope_bearer_token(scope: Scope) -> str | None:
    """`bearer_token` of the request of an ASGI scope, read from its header list (whose names are lower case)."""
    for name, value in scope["headers"]:
        if name == b"authorization":
            return bearer_of(value.decode("latin-1"))
    return None


def bearer_of(header: str) -> str | None:
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        return None
    return token.strip()


def scope_api_key(scope: Scope) -> str | None:
    """The key of a request to Anthropic's APIs: its `x-api-key` header (how Anthropic's clients send it), or
    else its bearer token."""
    for name, value in scope["headers"]:
        if name == b"x-api-key" and value.strip():
            return value.decode("latin-1").strip()
    return scope_bearer_token(scope)
