"""What serving an API call needs of the running server: the seam between the endpoints and `server.services`."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from starlette.requests import Request

from tokenrelay.backends.base import Backend
from tokenrelay.calls.record import Call
from tokenrelay.config import ModelSettings, Settings
from tokenrelay.limits.cost import Admitted

if TYPE_CHECKING:
    from tokenrelay.openai.responses.store import ResponseStore


class CallServices(Protocol):
    """`server.services.Services` is the implementation; unit tests give fakes."""

    settings: Settings
    responses: ResponseStore

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
