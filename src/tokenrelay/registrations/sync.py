"""Make this process's routed models match the registrations table.

Every replica and worker applies the table: right after its own writes, when a request names a model it
does not know (a node may just have registered it through another process), and every
`routing.registry_sync_seconds`. Applying adds new nodes, replaces nodes whose settings changed and removes
nodes no longer registered, exactly as a registration on this process would; a model created for a
registration goes with its last node. Nodes of the config file are not in the table and are never removed:
a registration that replaced one gives the config file's node back when it goes.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from datetime import datetime

from sqlalchemy.exc import SQLAlchemyError

from tokenrelay.backends.registry import Registry
from tokenrelay.backends.upstream.backend import RoutedBackend
from tokenrelay.config import Settings, UpstreamSettings
from tokenrelay.registrations.store import NodeStore, StoredNode

log = logging.getLogger(__name__)

Key = tuple[str, str]  # (model id, node name)
# The routed backend of a model id, made (and registered) when a node registers for a model that has none.
RoutedFor = Callable[[str], Awaitable[RoutedBackend]]


def configured_node(settings: Settings, model_id: str, name: str) -> UpstreamSettings | None:
    model = next((m for m in settings.models if m.id == model_id), None)
    return next((u for u in model.upstreams if u.label == name), None) if model is not None else None


class NodeSync:
    """The registrations this process has applied, and the task that keeps them current."""

    def __init__(
        self, store: NodeStore, registry: Registry, settings: Settings, routed_for: RoutedFor, interval: float
    ) -> None:
        self.store = store
        self.registry = registry
        self.settings = settings
        self.routed_for = routed_for
        self.interval = interval
        self.applied: dict[Key, UpstreamSettings] = {}
        self._lock = asyncio.Lock()  # one apply at a time: each awaits node changes halfway through
        self._next_look: asyncio.Task[None] | None = None
        self._task: asyncio.Task[None] | None = None
        self._skipped: set[tuple[str, str, datetime]] = set()
        self._failing = False

    async def start(self) -> None:
        await self.refresh()  # registrations survive a restart: applied before the first request
        self._task = asyncio.create_task(self._run(), name="node-registrations")

    async def close(self) -> None:
        for task in (self._task, self._next_look):
            if task is not None:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)

    async def refresh(self) -> None:
        async with self._lock:
            await self._apply(await self.store.load())

    async def refresh_for_unknown_model(self) -> None:
        """One fresh look at the table for requests naming a model this process does not serve.

        Requests arriving before that look starts share it; later ones need a look that starts after them
        (the registration they follow may have committed after the current one began reading).
        """
        if self._next_look is None:
            self._next_look = asyncio.create_task(self._fresh_look(), name="node-registrations-lookup")
        look = self._next_look
        with contextlib.suppress(SQLAlchemyError, OSError):  # the database is away: the request gets its 404
            await asyncio.shield(look)

    async def _fresh_look(self) -> None:
        async with self._lock:
            self._next_look = None
            await self._apply(await self.store.load())

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.interval)
            try:
                await self.refresh()
            except (SQLAlchemyError, OSError) as exc:
                if not self._failing:
                    log.warning("reloading registered nodes failed; keeping the current ones: %s", exc)
                self._failing = True
            else:
                self._failing = False

    # Applying -----------------------------------------------------------------------------------
    async def _apply(self, stored: list[StoredNode]) -> None:
        wanted: dict[Key, UpstreamSettings] = {}
        for node in stored:
            upstream = self._usable(node)
            if upstream is not None:
                wanted[(node.model_id, node.name)] = upstream
        for key, upstream in wanted.items():  # additions first: a model swapping nodes is never left empty
            if self.applied.get(key) != upstream:
                backend = await self.routed_for(key[0])
                await backend.add_node(upstream)
                self.applied[key] = upstream
        for key in [k for k in self.applied if k not in wanted]:
            await self._withdraw(*key)
            del self.applied[key]

    def _usable(self, node: StoredNode) -> UpstreamSettings | None:
        if node.upstream is None and (seen := (node.model_id, node.name, node.updated_at)) not in self._skipped:
            self._skipped.add(seen)  # warned once per version of the row, not at every sync
            log.warning("registered node %s of model %s skipped: %s", node.name, node.model_id, node.problem)
        return node.upstream

    async def _withdraw(self, model_id: str, name: str) -> None:
        backend = self.registry.find(model_id)
        if not isinstance(backend, RoutedBackend):
            return
        configured = configured_node(self.settings, model_id, name)
        if configured is not None:
            await backend.add_node(configured)
            return
        await backend.remove_node(name)
        if backend.dynamic and not backend.nodes:
            self.registry.remove(model_id)
            await backend.close()
