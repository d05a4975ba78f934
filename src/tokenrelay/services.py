"""Everything a running server holds, built by the app's lifespan (never at import)."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from starlette.requests import Request

from tokenrelay.accounting import Accounting
from tokenrelay.auth.verifier import KeyVerifier
from tokenrelay.backends.llamacpp.default_model import ensure_default_model
from tokenrelay.backends.llamacpp.engine import LlamaCppBackend
from tokenrelay.calls import Call
from tokenrelay.config import DEFAULT_MODEL_ID, ModelSettings, Settings
from tokenrelay.errors import AuthenticationError, ModelNotFound
from tokenrelay.metrics import Metrics
from tokenrelay.protocol.common import GenerationRequest
from tokenrelay.registry import Registry
from tokenrelay.requestlog import log_call

log = logging.getLogger(__name__)


@dataclass
class Services:
    settings: Settings
    registry: Registry = field(default_factory=Registry)
    extras_seen: set[str] = field(default_factory=set)
    metrics: Metrics = field(init=False)
    accounting: Accounting = field(init=False)

    def __post_init__(self) -> None:
        self.metrics = Metrics(self.backend_statuses)
        self.accounting = Accounting(self.settings)

    @property
    def verifier(self) -> KeyVerifier:
        return self.accounting.verifier

    async def start(self) -> None:
        await self.accounting.start()
        await self.accounting.check_exposure()
        for model in self.settings.served_models():
            backend = self._backend_for(model)
            await backend.start()
            self.registry.add(backend)

    def _backend_for(self, model: ModelSettings) -> LlamaCppBackend:
        path = model.path
        if path is None and model.id == DEFAULT_MODEL_ID:
            path = ensure_default_model(self.settings.data_dir)
        template = model.chat_template or self.settings.chat_template
        return LlamaCppBackend(model.id, path, self.settings.engine_for(model), template)

    async def close(self) -> None:
        # uvicorn has already waited (bounded by shutdown_timeout) for in-flight requests and cancelled the
        # rest; give the cancelled ones a moment to record themselves before the ledger's final flush.
        await self.accounting.drain(timeout=5.0)
        for backend in self.registry.all():
            await backend.close()
        await self.accounting.close()

    # Call accounting: the seam for the ledger, metrics and request logs -------------------------------
    def begin_call(self, call: Call, request: Request) -> None:
        """The caller was authenticated by `KeyAuthMiddleware` before the body was read."""
        principal = getattr(request.state, "principal", None)
        if principal is None:  # never serve a /v1 route the middleware did not see
            raise AuthenticationError("This request was not authenticated.")
        self.accounting.begin(call, principal)

    async def admit(self, call: Call, body: GenerationRequest) -> None:
        """After parsing: the key may use the model, and its limits can take the request's worst case."""
        if call.principal is not None and not call.principal.may_use(body.model):
            raise ModelNotFound(body.model)
        call.reservation = await self.accounting.admit(call, body, self.registry.get(body.model))

    def end_call(self, call: Call) -> None:
        if call.reported:
            return
        call.reported = True
        log_call(call)
        self.metrics.observe(call)
        self.accounting.end(call)

    def ready(self) -> bool:
        backends = self.registry.all()
        return bool(backends) and all(b.ready() for b in backends)

    def model_status(self) -> dict[str, Any]:
        return dict(self.backend_statuses())

    def backend_statuses(self) -> list[tuple[str, dict[str, Any]]]:
        return [(b.card.id, b.status()) for b in self.registry.all()]
