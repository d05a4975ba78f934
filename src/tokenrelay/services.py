"""Everything a running server holds, built by the app's lifespan (never at import)."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from starlette.requests import Request

from tokenrelay.backends.llamacpp.default_model import ensure_default_model
from tokenrelay.backends.llamacpp.engine import LlamaCppBackend
from tokenrelay.calls import Call
from tokenrelay.config import DEFAULT_MODEL_ID, ModelSettings, Settings
from tokenrelay.metrics import Metrics
from tokenrelay.registry import Registry
from tokenrelay.requestlog import log_call

log = logging.getLogger(__name__)


@dataclass
class Services:
    settings: Settings
    registry: Registry = field(default_factory=Registry)
    extras_seen: set[str] = field(default_factory=set)
    metrics: Metrics = field(init=False)

    def __post_init__(self) -> None:
        self.metrics = Metrics(self.backend_statuses)

    async def start(self) -> None:
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
        for backend in self.registry.all():
            await backend.close()

    # Call accounting: the seam for the ledger, metrics and request logs -------------------------------
    def begin_call(self, call: Call, request: Request) -> None:
        """Hook for admission (auth, limits) once they exist; records nothing yet."""

    def end_call(self, call: Call) -> None:
        if call.reported:
            return
        call.reported = True
        log_call(call)
        self.metrics.observe(call)

    def ready(self) -> bool:
        backends = self.registry.all()
        return bool(backends) and all(b.ready() for b in backends)

    def model_status(self) -> dict[str, Any]:
        return dict(self.backend_statuses())

    def backend_statuses(self) -> list[tuple[str, dict[str, Any]]]:
        return [(b.card.id, b.status()) for b in self.registry.all()]
