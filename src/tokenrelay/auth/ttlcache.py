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
        pending = self._loading.get(key)
        if pending is not None:
            return await asyncio.shield(pending)
        return await self._load(key, load)

    async def _load(self, key: K, load: Callable[[], Awaitable[V]]) -> V:
        future: asyncio.Future[V] = asyncio.get_running_loop().create_future()
        self._loading[key] = future
        try:
            value = await load()
        except BaseException as exc:
            future.set_exception(exc)
            future.exception()  # a failure nobody else awaited is not "never retrieved"
            raise
        finally:
            self._loading.pop(key, None)
        future.set_result(value)
        self._store(key, value)
        return value

    def _store(self, key: K, value: V) -> None:
        if len(self._values) >= self.max_entries:
            self._values.clear()
        self._values[key] = (time.monotonic(), value)

    def forget(self, key: K) -> None:
        self._values.pop(key, None)
