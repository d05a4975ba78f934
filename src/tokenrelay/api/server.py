"""The running server as the API edge sees it: one accessor for what the server holds and one for who is calling.

Every endpoint, dialect and operator route reaches the server through `services_of`, typed as the one class that
holds it (`server.services.Services`, built by the app's lifespan; unit tests put a fake of their own in its place).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from tokenrelay.auth.principal import Principal
from tokenrelay.errors import AuthenticationError

if TYPE_CHECKING:
    # Named for the type checker only: `server/` builds the app and sits above every package that serves it.
    from tokenrelay.server.services import Services as Services


def services_of(connection: Mapping[str, Any]) -> Services:
    """The running server's services; `connection` is a `Request` or its ASGI scope."""
    services: Services = connection["app"].state.services
    return services


def caller_of(connection: Mapping[str, Any]) -> Principal:
    """Who is calling, as the app's `Gate` authenticated it before any route ran (in the scope's state, not
    `request.state`, which would build a `State` object per request)."""
    principal: Principal | None = connection.get("state", {}).get("principal")
    if principal is None:  # never serve a protected route the gate did not see
        raise AuthenticationError("This request was not authenticated.")
    return principal
