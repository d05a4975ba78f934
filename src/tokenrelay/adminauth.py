"""Guard for operator endpoints (`/admin/*`, and `/metrics` when protected)."""

from __future__ import annotations

import hmac

from starlette.requests import Request

from tokenrelay.errors import AuthenticationError, PermissionDenied


def bearer_token(request: Request) -> str | None:
    header = request.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        return None
    return token.strip()


async def require_admin(request: Request) -> None:
    """Allow the request only with the configured admin key (`TOKENRELAY_ADMIN_KEY` / `admin_key`).

    401 without a usable bearer token, 403 with a token that is not an admin key. The key store (API keys
    issue) extends this to keys created with `--admin`.
    """
    token = bearer_token(request)
    if token is None:
        raise AuthenticationError("An admin API key is required (Authorization: Bearer <key>).")
    expected = request.app.state.services.settings.admin_key
    if expected is None or not hmac.compare_digest(token.encode(), expected.get_secret_value().encode()):
        raise PermissionDenied("This endpoint needs an admin key.")
