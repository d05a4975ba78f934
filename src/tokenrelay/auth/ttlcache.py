"""A small async cache with a time to live, where concurrent misses on one key share a single load."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Generic, TypeVar

K = TypeVar("K")
V = TypeVar("V")


class TTLCache(Generic[K, V]):
    """Written here rather than taken from a library because the point is the single-flight load on an
    event loop (200 requests arriving with one new key must cause one lookup, not 200), which the common
    TTL caches do not offer."""

    def __init__(self, ttl: float, max_entries: int = 10_000) -> None:
        self.ttl = ttl
        self.max_entries = max_entries
        self._values: dict[K, tuple[float, V]] = {}
        self._loading: dict[K, asyncio.Future[V]] = {}

    async def get(self, key: K, load: Callable[[], Awaitable[V]]) -> V:
        hit = self._values.get(key)
        if hit is not None and time.monotonic() - hit[0] < self.ttl:
            return hit[1]
        task = self._loading.get(key)
        if task is None:
            # The load runs as its own task, so a caller that goes away (and is cancelled) does not cancel
            # the lookup the other callers are waiting for.
            task = asyncio.ensure_future(self._load(key, load))
            task.add_done_callback(_retrieve)
            self._loading[key] = task
        return await asyncio.shield(task)

    async def _load(self, key: K, load: Callable[[], Awaitable[V]]) -> V:
        try:
            value = await load()
        finally:
            self._loading.pop(key, None)
        self._store(key, value)
        return value

    def _store(self, key: K, value: V) -> None:
        if len(self._values) >= self.max_entries:
            self._values.clear()
        self._values[key] = (time.monotonic(), value)

    def forget(self, key: K) -> None:
        self._values.pop(key, None)


def _retrieve(task: asyncio.Future[object]) -> None:
    """Mark a failed load's exception as seen even if every caller had gone away (no asyncio warning)."""
    if not task.cancelled():
        task.exception()
