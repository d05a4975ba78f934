"""Everything a running server holds, built by the app's lifespan (never at import)."""

from __future__ import annotations

import asyncio
import logging
import os
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import Tracer
from sqlalchemy.ext.asyncio import AsyncEngine
from starlette.requests import Request

from tokenrelay.api.server import caller_of
from tokenrelay.auth.keystore import KeyStore
from tokenrelay.auth.verifier import KeyVerifier
from tokenrelay.backends.base import Backend
from tokenrelay.backends.fallback import FallbackBackend, Fallbacks
from tokenrelay.backends.llamacpp.default_model import DEFAULT_MODELS
from tokenrelay.backends.llamacpp.engine import LlamaCppBackend
from tokenrelay.backends.registry import Registry
from tokenrelay.backends.residency import Residency
from tokenrelay.backends.resident import Keeping, ResidentModel
from tokenrelay.backends.tokens import EngineCounter
from tokenrelay.backends.upstream.backend import RoutedBackend
from tokenrelay.backends.upstream.http1 import Pool
from tokenrelay.backends.upstream.members import EmbeddedMember
from tokenrelay.backends.upstream.transport import TransportFactory
from tokenrelay.calls.batch_line import batch_of
from tokenrelay.calls.record import Call
from tokenrelay.calls.reporting import FinishedCalls
from tokenrelay.config import ModelSettings, Settings, UpstreamSettings
from tokenrelay.errors import ModelNotFound
from tokenrelay.limits.cost import Admitted
from tokenrelay.models.hub import chat_template_from_repo, model_file
from tokenrelay.observability.metrics import Metrics
from tokenrelay.observability.metrics.batches import BatchProgress
from tokenrelay.observability.metrics.multiprocess import shared_metrics_dir
from tokenrelay.observability.requestlog import log_call
from tokenrelay.observability.tracing import genai
from tokenrelay.observability.tracing.setup import Tracing
from tokenrelay.openai.batches.runner import BatchRunner
from tokenrelay.pricing.book import PriceBook
from tokenrelay.principal import Principal
from tokenrelay.registrations.sealing import KeySeal
from tokenrelay.registrations.store import NodeStore
from tokenrelay.registrations.sync import NodeSync
from tokenrelay.server.accounting import Accounting
from tokenrelay.store.batches import BatchStore
from tokenrelay.store.files import FileStore
from tokenrelay.store.responses import ResponseStore
from tokenrelay.usage.ledger import Ledger

log = logging.getLogger(__name__)


@dataclass
class Services:
    settings: Settings
    registry: Registry = field(default_factory=Registry)
    extras_seen: set[str] = field(default_factory=set)
    tracing: Tracing | None = None  # traces exported (telemetry.otlp_endpoint), else None
    transport: TransportFactory = Pool  # what upstream nodes' connections are made with
    metrics: Metrics = field(init=False)
    accounting: Accounting = field(init=False)
    nodes: NodeSync = field(init=False)
    worker: int | None = field(init=False)  # this process's pid when it is one of several workers
    finished: FinishedCalls = field(init=False)
    prices: PriceBook = field(init=False)
    responses: ResponseStore = field(init=False)  # stored Responses API objects, beside the ledger
    files: FileStore = field(init=False)  # the Batch API's files
    batches: BatchStore = field(init=False)
    batch_runner: BatchRunner = field(init=False)
    falling_back: frozenset[str] = field(init=False)  # the models with fallbacks
    residency: Residency = field(init=False)  # which engine models are loaded
    hub_files: dict[str, Path] = field(init=False, default_factory=dict)  # the GGUFs of `source` models, by id

    def __post_init__(self) -> None:
        several = self.settings.workers > 1
        engine = self.settings.engine
        self.residency = Residency(engine.max_loaded_models, engine.max_memory)
        self.worker = os.getpid() if several else None
        self.metrics = Metrics(self.backend_statuses, self.batch_progress, shared_metrics_dir() if several else None)
        self.prices = PriceBook(self.settings.served_models(), self._nodes_of)
        self.falling_back = frozenset(m.id for m in self.settings.served_models() if m.fallbacks or m.context_fallbacks)
        self.accounting = Accounting(self.settings, self.prices, None if self.tracing is None else self.tracing.tracer)
        self.responses = ResponseStore(self.accounting.engine, self.settings.responses)
        self.files = FileStore(self.accounting.engine)
        self.batches = BatchStore(self.accounting.engine)
        self.batch_runner = BatchRunner(
            self.batches,
            self.settings.batches,
            self.settings.max_n,
            self.accounting.keys.principal_by_id,
            self.usable,
            self.commit_finished_calls,
        )
        store = NodeStore(self.accounting.engine, KeySeal(self.settings.admin_key))
        self.nodes = NodeSync(
            store, self.registry, self.settings, self.routed_backend, self.settings.routing.registry_sync_seconds
        )
        self.finished = FinishedCalls([self._log_call, self.metrics.observe, self.accounting.end])

    @property
    def verifier(self) -> KeyVerifier:
        return self.accounting.verifier

    @property
    def keys(self) -> KeyStore:
        return self.accounting.keys

    @property
    def ledger(self) -> Ledger:
        return self.accounting.ledger

    @property
    def database(self) -> AsyncEngine:
        return self.accounting.engine

    async def start(self) -> None:
        await self.accounting.start()
        await self.accounting.check_exposure()
        self.responses.start()
        models = self.settings.served_models()
        # A Hub model's GGUF is found in the cache or downloaded once, before any engine is built, off the loop.
        self.hub_files = {m.id: await asyncio.to_thread(model_file, m.source) for m in models if m.source is not None}
        backends = [self._backend_for(model) for model in models]
        # Pinned models load first, so that the residency limits never leave one of them out.
        for model, backend in sorted(zip(models, backends, strict=True), key=lambda pair: not pair[0].pin):
            if not model.on_demand:
                await backend.start()
        for backend in backends:
            self.registry.add(backend)
        await self.nodes.start()

    def _backend_for(self, model: ModelSettings) -> Backend:
        if not model.upstreams:
            return self._resident(model)
        engine = self._engine_for(model) if model.embedded else None
        return self._routed(model.id, model, engine, model.upstreams)

    def _resident(self, model: ModelSettings) -> ResidentModel:
        """An engine model served alone: loaded at start or on demand, and unloaded within the residency limits."""
        engine = self.settings.engine
        keeping = Keeping(model.pin, engine.keep_alive if model.keep_alive is None else model.keep_alive)
        return ResidentModel(
            model.id,
            self._gguf_path(model),
            lambda: self._engine_for(model),
            self.residency,
            self.settings.engine_for(model),
            keeping,
            engine.load_wait,
        )

    def _gguf_path(self, model: ModelSettings) -> Path:
        path = model.path if model.source is None else self.hub_files[model.id]  # pulled in `start`
        if path is None:  # a default model (the settings allow no other without a path or a source)
            path = DEFAULT_MODELS[model.id](self.settings.data_dir)
        return path

    def _engine_for(self, model: ModelSettings) -> LlamaCppBackend:
        path = self._gguf_path(model)
        template = model.chat_template or self.settings.chat_template
        probes = self.settings.data_dir / "cpu-probes"
        engine = self.settings.engine_for(model)
        # Asked in the load thread, and only when the GGUF carries no template of its own.
        repo_template = None if model.source is None else partial(chat_template_from_repo, model.source)
        return LlamaCppBackend(
            model.id, path, engine, template, probe_dir=probes, embeddings=model.embeddings, repo_template=repo_template
        )

    def _routed(
        self, model_id: str, model: ModelSettings | None, engine: Backend | None, nodes: list[UpstreamSettings]
    ) -> RoutedBackend:
        routing = self.settings.routing_for(model)
        if engine is None:
            return RoutedBackend(
                model_id, routing, nodes, dynamic=model is None, tracer=self._tracer, transport=self.transport
            )
        capacity, counter = None, None
        if isinstance(engine, LlamaCppBackend):
            capacity = engine.engine_settings.slots + engine.engine_settings.queue_size
            counter = EngineCounter(engine)
        member = EmbeddedMember(engine, routing, max_in_flight=capacity)
        return RoutedBackend(
            model_id, routing, nodes, embedded=member, counter=counter, tracer=self._tracer, transport=self.transport
        )

    @property
    def _tracer(self) -> Tracer | None:
        return None if self.tracing is None else self.tracing.tracer

    async def routed_backend(self, model_id: str) -> RoutedBackend:
        """The routed backend of `model_id`, made when a node registers for a model that has none yet.

        A model served by the embedded engine alone becomes a mixed one; an id not in the configuration
        becomes a model of its own, removed again with its last node.
        """
        current = self.registry.find(model_id)
        if isinstance(current, RoutedBackend):
            return current
        backend = self._routed(model_id, self.model_settings(model_id), current, [])
        await backend.start()
        self.registry.put(backend)
        return backend

    async def commit_finished_calls(self) -> None:
        """Report the calls that ended this loop turn now, not at the turn's end, and commit their ledger rows."""
        self.finished.flush()
        await self.accounting.ledger.flush()

    def _nodes_of(self, model_id: str) -> dict[str, UpstreamSettings]:
        backend = self.registry.find(model_id)
        if not isinstance(backend, RoutedBackend):
            return {}
        return {name: node.settings for name, node in backend.nodes.items()}

    def usable(self, principal: Principal, model_id: str) -> str | None:
        """Why `principal` cannot use `model_id` here (None when it can), in the words of a 404."""
        if self.registry.find(model_id) is None or not principal.may_use(model_id):
            return ModelNotFound(model_id).message
        return None

    def model_settings(self, model_id: str) -> ModelSettings | None:
        """The configured settings of `model_id`; None for a model that nodes brought by registering."""
        return next((m for m in self.settings.served_models() if m.id == model_id), None)

    async def close(self) -> None:
        # uvicorn has already waited (bounded by shutdown_timeout) for in-flight requests and cancelled the
        # rest; give the cancelled ones a moment to record themselves before the ledger's final flush.
        self.finished.flush()
        await self.accounting.drain(timeout=5.0)
        self.finished.flush()  # what the calls that unwound during the drain left
        await self.nodes.close()
        await self.responses.close()
        for backend in self.registry.all():
            await backend.close()
        await self.accounting.close()
        self.metrics.close()

    # Call accounting: the seam for the ledger, metrics and request logs -------------------------------
    def begin_call(self, call: Call, request: Request) -> None:
        """The caller was authenticated (by the app's `Gate`) before the body was read."""
        self.accounting.begin(call, caller_of(request))
        call.batch_id = batch_of(request.scope)
        call.ticket.background = call.batch_id is not None  # batch lines yield to interactive requests
        if self.tracing is not None:
            # The call's own span, a child of the HTTP server span (which ends with the response's last byte,
            # before the call is over). It is the current span until the call ends, in the call's task: the
            # admission's, the engine's and the node attempts' spans are its children.
            call.span = self.tracing.tracer.start_span(genai.OPERATIONS.get(call.endpoint, call.endpoint))
            call.trace_token = otel_context.attach(trace.set_span_in_context(call.span))
            call.ticket.tracer = self.tracing.tracer
            if self.tracing.capture_content:
                call.captured = []

    async def admit(self, call: Call, body: Admitted) -> Backend:
        """After parsing: the key may use the model, and its limits can take the request's worst case.
        Returns the backend that serves the model."""
        if call.principal is not None and not call.principal.may_use(body.model):
            raise ModelNotFound(body.model)
        if self.tracing is None or call.span is None:
            return await self._admit(call, body)
        call.span.set_attributes(genai.request_attributes(call, body, self.tracing.capture_content))
        call.span.update_name(f"{genai.OPERATIONS.get(call.endpoint, call.endpoint)} {call.model}")
        with self.tracing.tracer.start_as_current_span("admission") as span:
            backend = await self._admit(call, body)
            if call.reservation is not None:
                span.set_attribute("tokenrelay.reserved_tokens", call.reservation.tokens)
            return backend

    async def _admit(self, call: Call, body: Admitted) -> Backend:
        backend = self._with_fallbacks(call, body.model, await self.backend(body.model))
        call.reservation = await self.accounting.admit(call, body, backend)
        return backend

    def _with_fallbacks(self, call: Call, model_id: str, backend: Backend) -> Backend:
        """`backend`, or for a model with fallbacks this call's wrapper of it, which may pass the request on to
        those of its fallbacks the caller's key may use."""
        if model_id not in self.falling_back:
            return backend
        principal = call.principal
        may_use = principal.may_use if principal is not None else _anything
        return FallbackBackend(model_id, backend, Fallbacks(self.model_settings, self.registry.find, may_use))

    async def backend(self, model_id: str) -> Backend:
        """The backend serving `model_id`; an id this process does not know is first looked up among the
        registered nodes, since another replica or worker may have registered it a moment ago."""
        if self.registry.find(model_id) is None:
            await self.nodes.refresh_for_unknown_model()
        return self.registry.get(model_id)

    def end_call(self, call: Call) -> None:
        """Report a finished call to the log, metrics and ledger (`api.lifecycle.run_call` ends each call once)."""
        if call.span is not None:
            genai.finish(call.span, call)
            call.span.end()
            otel_context.detach(call.trace_token)  # type: ignore[arg-type]
        self.finished.add(call)

    def _log_call(self, call: Call) -> None:
        log_call(call, self.worker)

    def ready(self) -> bool:
        backends = self.registry.all()
        return bool(backends) and all(b.ready() for b in backends)

    def model_status(self) -> dict[str, Any]:
        """Per-model state for the unauthenticated `/health`: node addresses are left out (they are for
        operators, through `/admin/nodes`)."""
        chat = {model.id: model.chat for model in self.settings.served_models()}
        return {
            model: public_status(status) | {"chat": chat.get(model, True)} for model, status in self.backend_statuses()
        }

    def batch_progress(self) -> BatchProgress:
        return BatchProgress(self.batch_runner.states, self.batch_runner.lines_done)

    def backend_statuses(self) -> list[tuple[str, dict[str, Any]]]:
        return [(b.card.id, b.status()) for b in self.registry.all()]


def _anything(model_id: str) -> bool:
    return True


def public_status(status: dict[str, Any]) -> dict[str, Any]:
    nodes = status.get("nodes")
    if not nodes:
        return status
    return status | {"nodes": [{k: v for k, v in node.items() if k != "url"} for node in nodes]}
