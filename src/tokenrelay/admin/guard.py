"""Guard for operator endpoints (`/admin/*`, and `/metrics` when protected)."""

from __future__ import annotations

from starlette.requests import Request

from tokenrelay.api.server import services_of
from tokenrelay.auth.bearer import bearer_token
from tokenrelay.auth.loopback import is_loopback
from tokenrelay.errors import AuthenticationError, PermissionDenied


async def require_admin(request: Request) -> None:
    """Allow the request only with an admin key: `TOKENRELAY_ADMIN_KEY` (`admin_key`) or a key created with `--admin`.

    401 without a usable bearer token, 403 with a token that is not an admin key (ordinary, unknown, revoked
    or expired keys alike). A keyless server on loopback, whose `/v1` is open, opens its reads too (the usage page
    works as the API does); what changes who may use the server (keys, nodes) still needs an admin key.
    """
    if request.method == "GET" and await _keyless_on_loopback(request):
        return
    token = bearer_token(request)
    if token is None:
        raise AuthenticationError("An admin API key is required (Authorization: Bearer <key>).")
    principal = await services_of(request).verifier.verify(token)
    if principal is None or not principal.admin:
        raise PermissionDenied("This endpoint needs an admin key.")


async def _keyless_on_loopback(request: Request) -> bool:
    services = services_of(request)
    settings = services.settings
    if settings.admin_key is not None or not is_loopback(settings.host):
        return False
    return not await services.verifier.auth_required()
