"""An engine model that is loaded when a request needs it and unloaded when idle (`Residency` decides when)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from tokenrelay.backends.base import (
    ENGINE_KIND,
    Backend,
    Embeddings,
    Events,
    ModelCard,
    PromptCount,
    Ticket,
    aclose_quietly,
)
from tokenrelay.backends.llamacpp.context import cells_per_sequence
from tokenrelay.backends.llamacpp.engine import LlamaCppBackend
from tokenrelay.backends.llamacpp.scheduler import long_lane_cells
from tokenrelay.backends.residency import Residency
from tokenrelay.config import EngineSettings
from tokenrelay.errors import APIError, Overloaded
from tokenrelay.models.gguf_header import GgufFacts, NotGguf, read_facts
from tokenrelay.protocol.chat import ChatCompletionRequest
from tokenrelay.protocol.completions import CompletionRequest
from tokenrelay.protocol.embeddings import EmbeddingRequest

log = logging.getLogger(__name__)

State = Literal["unloaded", "loading", "loaded", "unloading"]
KV_BYTES = {"q8_0": 34 / 32, "f16": 2.0}  # per value: Q8_0 keeps 32 values in 34 bytes


def memory_estimate(facts: GgufFacts, settings: EngineSettings) -> int:
    """The weights plus every KV cell the engine would allocate for this model (its long slots included). Every layer
    is counted at a long slot's length: an upper bound for a model with sliding-window layers, which keep less."""
    short = settings.slots * cells_per_sequence(settings.ctx_per_slot)
    per_value = (KV_BYTES[settings.kv_type] + KV_BYTES[settings.v_type]) / 2  # K and V hold as many values
    memory = facts.file_bytes + facts.kv_bytes(short, per_value)
    long = long_lane_cells(settings, facts.context_length)
    if long is not None:
        memory += settings.long_slots * facts.kv_bytes(long, KV_BYTES[settings.long_kv_type])
    return memory


def card_before_load(model_id: str, path: Path, facts: GgufFacts | None, settings: EngineSettings) -> ModelCard:
    """What admission and `/v1/models` know of a model that is not loaded: the slot sizes its settings give."""
    created = int(path.stat().st_mtime) if path.exists() else int(time.time())
    if facts is None:
        return ModelCard(id=model_id, owned_by="tokenrelay", created=created)
    contexts = {cells_per_sequence(settings.ctx_per_slot)}
    long = long_lane_cells(settings, facts.context_length) if settings.long_slots else None
    if long is not None:
        contexts.add(long)
    ordered = tuple(sorted(contexts))
    return ModelCard(model_id, "tokenrelay", created, context_length=ordered[-1], slot_contexts=ordered)


@dataclass
class Keeping:
    """How long this model stays loaded when idle, and whether the residency limits may unload it."""

    pinned: bool = False
    keep_alive: float = -1.0  # seconds; 0: unload after each answer; negative: never


class ResidentModel:
    """A `Backend` over an engine it loads on demand: requests hold it loaded while they run, and it is unloaded
    for room (least recently used first), after `keep_alive` idle seconds, or by the operator."""

    kind = ENGINE_KIND

    def __init__(
        self,
        model_id: str,
        path: Path,
        make_engine: Callable[[], LlamaCppBackend],
        residency: Residency,
        settings: EngineSettings,
        keeping: Keeping,
        load_wait: float,
    ) -> None:
        self.path = path
        self._make_engine = make_engine
        self.residency = residency
        self.keeping = keeping
        self.load_wait = load_wait
        try:
            facts: GgufFacts | None = read_facts(path)
        except (NotGguf, OSError):
            facts = None  # llama.cpp says what is wrong when the load is tried
        self.card = card_before_load(model_id, path, facts, settings)
        self.memory_estimate = memory_estimate(facts, settings) if facts is not None else 0
        self._fingerprint = LlamaCppBackend.fingerprint_of(path)
        self.engine: LlamaCppBackend | None = None
        self.state: State = "unloaded"
        self.in_flight = 0
        self.waiting = 0  # requests waiting for this model's load
        self.last_used = 0.0
        self.loads = self.unloads = 0
        self.load_seconds = 0.0
        self._loading: asyncio.Task[None] | None = None
        self._loading_engine: LlamaCppBackend | None = None  # the engine being loaded (its progress)
        self._idle_timer: asyncio.TimerHandle | None = None
        self._requested_keep_alive: float | None = None  # the last finished request's own keep_alive
        self._unloads: set[asyncio.Task[bool]] = set()  # keep-alive unloads under way (held so they are not collected)
        residency.join(self)

    # What the residency asks ---------------------------------------------------------------------------
    @property
    def pinned(self) -> bool:
        return self.keeping.pinned

    @property
    def holds_memory(self) -> bool:
        return self.state != "unloaded"

    @property
    def evictable(self) -> bool:
        return self.state == "loaded" and self.in_flight == 0 and self.waiting == 0 and not self.pinned

    # Loading and unloading -------------------------------------------------------------------------------
    async def start(self) -> None:
        """Load at start unless the limits are already full (then the first request loads it)."""
        if self.residency.fits(self):
            await self.load()
        else:
            log.info("model %s will load on its first request (the residency limits are full)", self.card.id)

    async def load(self) -> LlamaCppBackend:
        """The loaded engine: loads it, or joins the load under way, waiting at most `load_wait` seconds."""
        while self.engine is None or self.state != "loaded":
            if self._loading is None:
                self._loading = asyncio.get_running_loop().create_task(self._load())
                self._loading.add_done_callback(_retrieve)
            try:
                await asyncio.wait_for(asyncio.shield(self._loading), self.load_wait)
            except TimeoutError:
                raise Overloaded(
                    f"The model `{self.card.id}` is loading; retry shortly.", headers={"Retry-After": "5"}
                ) from None
        return self.engine

    async def _load(self) -> None:
        try:
            async with self.residency.turn:
                if self.state == "loaded":
                    return
                await self.residency.make_room(self)
                self.state = "loading"
                started = time.monotonic()
                log.info("loading model %s on demand", self.card.id)
                engine = self._loading_engine = self._make_engine()
                try:
                    await engine.start()
                except Exception as exc:
                    self.state = "unloaded"
                    await engine.close()
                    log.exception("model %s failed to load", self.card.id)
                    message = f"The model `{self.card.id}` failed to load (the server log says why)."
                    raise APIError(message, code="model_load_failed") from exc
                self.engine, self.card, self.state = engine, engine.card, "loaded"
                self.loads += 1
                self.load_seconds += time.monotonic() - started
                self.last_used = time.monotonic()
                log.info("model %s loaded in %.2f s", self.card.id, time.monotonic() - started)
        finally:
            self._loading, self._loading_engine = None, None

    async def unload(self, reason: str) -> bool:
        """Unload now unless a request is in flight (True when it was unloaded)."""
        async with self.residency.turn:
            return await self.unload_now(reason)

    async def unload_now(self, reason: str) -> bool:
        """Unload, the residency's turn already held."""
        if self.state != "loaded" or self.engine is None or self.in_flight or self.waiting:
            return False
        engine, self.engine, self.state = self.engine, None, "unloading"
        self._cancel_idle_timer()
        try:
            await engine.close()
        finally:
            self.state = "unloaded"
            self.unloads += 1
            log.info("model %s unloaded (%s)", self.card.id, reason)
            self.residency.changed()
        return True

    # Requests hold the model loaded while they run -------------------------------------------------------
    async def _hold(self) -> LlamaCppBackend:
        # A request waiting for the load already keeps the model: otherwise another model's load, next in turn,
        # could unload it before its waiters wake, and two models would unload each other without end.
        self.waiting += 1
        try:
            engine = await self.load()
        except BaseException:
            self.waiting -= 1
            self.residency.changed()  # a load waiting for room may take this model's now
            raise
        self.waiting -= 1
        self.in_flight += 1  # no await since `load` saw it loaded: no unload can come between
        self._cancel_idle_timer()
        return engine

    def _let_go(self, keep_alive: float | None = None) -> None:
        """A request is done; `keep_alive` is its own (Ollama's per-request field): the last request to finish
        decides how long the model stays idle, the model's own setting when it sent none."""
        self.in_flight -= 1
        self.last_used = time.monotonic()
        self._requested_keep_alive = keep_alive
        if self.in_flight:
            return
        self.residency.changed()
        keep_alive = self.keeping.keep_alive if self._requested_keep_alive is None else self._requested_keep_alive
        if self.pinned or keep_alive < 0:
            return
        loop = asyncio.get_running_loop()
        reason = "keep_alive 0" if keep_alive == 0 else f"idle for {keep_alive:g} s"
        self._idle_timer = loop.call_later(keep_alive, self._unload_idle, reason)

    def _unload_idle(self, reason: str) -> None:
        self._idle_timer = None
        task = asyncio.get_running_loop().create_task(self.unload(reason))
        self._unloads.add(task)
        task.add_done_callback(self._unloads.discard)

    def _cancel_idle_timer(self) -> None:
        if self._idle_timer is not None:
            self._idle_timer.cancel()
            self._idle_timer = None

    async def _stream(
        self, events: Callable[[LlamaCppBackend], AsyncIterator[Events]], keep_alive: float | None
    ) -> AsyncIterator[Events]:
        engine = await self._hold()
        batches = events(engine)
        try:
            async for batch in batches:
                yield batch
        finally:
            await aclose_quietly(batches)
            self._let_go(keep_alive)

    # Backend -----------------------------------------------------------------------------------------------
    def chat(self, request: ChatCompletionRequest, ticket: Ticket) -> AsyncIterator[Events]:
        return self._stream(lambda engine: engine.chat(request, ticket), request.keep_alive)

    def complete(self, request: CompletionRequest, ticket: Ticket) -> AsyncIterator[Events]:
        return self._stream(lambda engine: engine.complete(request, ticket), request.keep_alive)

    async def count_chat_prompt(self, request: ChatCompletionRequest) -> PromptCount:
        engine = await self._hold()
        try:
            return await engine.count_chat_prompt(request)
        finally:
            self._let_go()

    async def embed(self, request: EmbeddingRequest, ticket: Ticket) -> Embeddings:
        engine = await self._hold()
        try:
            return await engine.embed(request, ticket)
        finally:
            self._let_go()

    async def loaded(self) -> Backend:
        return await self.load()

    async def close(self) -> None:
        self._cancel_idle_timer()
        if self._loading is not None:
            await asyncio.gather(self._loading, return_exceptions=True)
        if self.engine is not None:
            engine, self.engine, self.state = self.engine, None, "unloaded"
            await engine.close()

    def ready(self) -> bool:
        return True  # an unloaded model is served too: its first request loads it

    def fingerprint(self) -> str:
        return self._fingerprint

    def status(self) -> dict[str, object]:
        engine: dict[str, object] = self.engine.status() if self.engine is not None else {"backend": self.kind}
        if self._loading_engine is not None:
            engine["load_progress"] = round(self._loading_engine.load_fraction, 2)
        return engine | {
            "ready": True,
            "state": self.state,
            "context_length": self.card.context_length,
            "pinned": self.pinned,
            "in_flight": self.in_flight,
            "resident": 1 if self.holds_memory else 0,
            "memory_bytes": self.memory_estimate if self.holds_memory else 0,
            "memory_estimate_bytes": self.memory_estimate,
            "loads": self.loads,
            "unloads": self.unloads,
            "load_seconds": round(self.load_seconds, 3),
        }


def _retrieve(task: asyncio.Task[None]) -> None:
    """A load whose waiters all gave up still ends: its failure is logged there, not left unretrieved."""
    if not task.cancelled():
        task.exception()
