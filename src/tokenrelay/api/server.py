"""The running server as the API edge sees it: `Server`, what every dialect and operator route may use of it, and
the one pair of accessors, for the server (`services_of`) and for who is calling (`caller_of`).

`server.services.Services` implements `Server` (the type checker holds it to that where the app is given it,
`serve_with`); the edge never names it, since `server/` builds the app and sits above every package that serves
it. Unit tests put a fake of their own in its place.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Protocol

from sqlalchemy.ext.asyncio import AsyncEngine
from starlette.requests import Request

from tokenrelay.auth.keystore import KeyStore
from tokenrelay.auth.verifier import KeyVerifier
from tokenrelay.backends.base import Backend
from tokenrelay.backends.registry import Registry
from tokenrelay.calls.record import Call
from tokenrelay.config import ModelSettings, Settings
from tokenrelay.errors import AuthenticationError
from tokenrelay.limits.cost import Admitted
from tokenrelay.observability.metrics import Metrics
from tokenrelay.principal import Principal
from tokenrelay.registrations.sync import NodeSync
from tokenrelay.store.batches import BatchStore
from tokenrelay.store.files import FileStore
from tokenrelay.store.responses import ResponseStore
from tokenrelay.usage.ledger import Ledger

if TYPE_CHECKING:
    from starlette.applications import Starlette


class Waking(Protocol):
    def wake(self) -> None:
        """Look for work now rather than at the next poll."""


class Server(Protocol):
    """What a running server holds and does for the API edge. Read-only properties: the edge never replaces them."""

    @property
    def settings(self) -> Settings: ...

    @property
    def registry(self) -> Registry:
        """The served models' backends."""

    @property
    def verifier(self) -> KeyVerifier: ...

    @property
    def keys(self) -> KeyStore: ...

    @property
    def ledger(self) -> Ledger: ...

    @property
    def database(self) -> AsyncEngine:
        """Keys, the ledger and the stores below live in it."""

    @property
    def metrics(self) -> Metrics: ...

    @property
    def nodes(self) -> NodeSync:
        """Upstream nodes registered at run time."""

    @property
    def responses(self) -> ResponseStore: ...

    @property
    def files(self) -> FileStore: ...

    @property
    def batches(self) -> BatchStore: ...

    @property
    def batch_runner(self) -> Waking: ...

    @property
    def extras_seen(self) -> set[str]:
        """Request fields outside the API already logged (each is logged once)."""

    def begin_call(self, call: Call, request: Request) -> None:
        """The caller (authenticated before the body was read) becomes the call's principal."""

    async def admit(self, call: Call, body: Admitted) -> Backend:
        """The key may use the model and its limits take the request's worst case: the model's backend."""

    async def backend(self, model_id: str) -> Backend:
        """The backend serving `model_id` (a 404 for an unknown id)."""

    def model_settings(self, model_id: str) -> ModelSettings | None:
        """The configured settings of a model; None for one that nodes brought by registering."""

    def end_call(self, call: Call) -> None:
        """Report the finished call to the request log, metrics and ledger."""

    def ready(self) -> bool: ...

    def model_status(self) -> dict[str, Any]:
        """Each model's state, for `/health`."""


def serve_with(app: Starlette, server: Server) -> None:
    """Make `server` what the app's requests reach (the app's lifespan, once it is built)."""
    app.state.services = server


def services_of(connection: Mapping[str, Any]) -> Server:
    """The running server; `connection` is a `Request` or its ASGI scope."""
    server: Server = connection["app"].state.services
    return server


def caller_of(connection: Mapping[str, Any]) -> Principal:
    """Who is calling, as the app's `Gate` authenticated it before any route ran (in the scope's state, not
    `request.state`, which would build a `State` object per request)."""
    principal: Principal | None = connection.get("state", {}).get("principal")
    if principal is None:  # never serve a protected route the gate did not see
        raise AuthenticationError("This request was not authenticated.")
    return principal
