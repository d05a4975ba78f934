"""Guard for operator endpoints (`/admin/*`, and `/metrics` when protected)."""

from __future__ import annotations

from starlette.requests import HTTPConnection, Request
from starlette.types import Scope

from tokenrelay.errors import AuthenticationError, PermissionDenied


def bearer_token(request: HTTPConnection) -> str | None:
    return bearer_of(request.headers.get("authorization", ""))


def scope_bearer_token(scope: Scope) -> str | None:
    """`bearer_token` of the request of an ASGI scope, read from its header list (whose names are lower case)
    without the `Headers` object a connection builds."""
    for name, value in scope["headers"]:
        if name == b"authorization":
            return bearer_of(value.decode("latin-1"))
    return None


def bearer_of(header: str) -> str | None:
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        return None
    return token.strip()


async def require_admin(request: Request) -> None:
    """Allow the request only with an admin key: `TOKENRELAY_ADMIN_KEY` (`admin_key`) or a key created with `--admin`.

    401 without a usable bearer token, 403 with a token that is not an admin key (ordinary, unknown, revoked
    or expired keys alike).
    """
    token = bearer_token(request)
    if token is None:
        raise AuthenticationError("An admin API key is required (Authorization: Bearer <key>).")
    principal = await request.app.state.services.verifier.verify(token)
    if principal is None or not principal.admin:
        raise PermissionDenied("This endpoint needs an admin key.")
