"""Which engine models are in memory: the limits on how many and how much, and which idle model makes room.

Every engine model served alone (no upstream nodes) is a `ResidentModel`; they all answer to one `Residency`,
which serialises loads and evictions so two loads never both count the same free room.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator
from typing import TYPE_CHECKING

from tokenrelay.errors import Overloaded

if TYPE_CHECKING:
    from tokenrelay.backends.resident import ResidentModel

log = logging.getLogger(__name__)


class Residency:
    def __init__(self, max_loaded: int | None = None, max_memory: int | None = None) -> None:
        self.max_loaded = max_loaded
        self.max_memory = max_memory
        self.models: list[ResidentModel] = []
        self.turn = asyncio.Lock()  # one load (with the evictions it needs) at a time
        self._changed = asyncio.Event()  # a model went idle or was unloaded: room may have appeared

    def join(self, model: ResidentModel) -> None:
        self.models.append(model)

    def resident(self) -> Iterator[ResidentModel]:
        """The models that hold memory now (loaded, loading or still unloading)."""
        return (model for model in self.models if model.holds_memory)

    def fits(self, model: ResidentModel) -> bool:
        """Whether `model` can load beside the models in memory now."""
        others = [m for m in self.resident() if m is not model]
        if self.max_loaded is not None and len(others) + 1 > self.max_loaded:
            return False
        if self.max_memory is not None and others:  # a model alone always loads, even past the budget
            return sum(m.memory_estimate for m in others) + model.memory_estimate <= self.max_memory
        return True

    def victim(self, model: ResidentModel) -> ResidentModel | None:
        """The least recently used loaded model with nothing in flight that is not pinned (None: none now)."""
        idle = [m for m in self.models if m is not model and m.evictable]
        return min(idle, key=lambda m: m.last_used, default=None)

    async def make_room(self, model: ResidentModel) -> None:
        """Unload idle models, least recently used first, until `model` fits; while every model in the way is busy
        or pinned, wait for one to go idle (the caller bounds the wait)."""
        while not self.fits(model):
            victim = self.victim(model)
            if victim is not None:
                await victim.unload_now(f"to make room for {model.card.id}")
                continue
            if all(m.pinned for m in self.resident() if m is not model):
                raise Overloaded(
                    f"The model `{model.card.id}` cannot be loaded: pinned models fill engine.max_loaded_models or "
                    "engine.max_memory."
                )
            log.info("model %s waits for a loaded model to go idle", model.card.id)
            self._changed.clear()
            await self._changed.wait()

    def changed(self) -> None:
        self._changed.set()
