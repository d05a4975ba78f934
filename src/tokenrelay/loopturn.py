"""Work gathered during one turn of the event loop and done once, when that turn ends."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")


class LoopTurnBatch(Generic[T]):
    """Items added during one loop turn, handed to `run` together by one `call_soon` callback.

    An item waits at most for the rest of the turn that added it; outside a running loop it is handed to
    `run` at once. A loop that stopped before its callback ran keeps what it held: the next loop to add an
    item starts a batch of its own rather than waiting on a callback that never comes."""

    def __init__(self, run: Callable[[list[T]], None]) -> None:
        self._run = run
        self._items: list[T] = []
        self._loop: asyncio.AbstractEventLoop | None = None  # the loop whose callback will run `_items`

    def add(self, item: T) -> None:
        if not self._items or self._loop is None or not self._loop.is_running():
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:
                self._run([item])
                return
            self._items, self._loop = [], loop
            loop.call_soon(self.flush)
        self._items.append(item)

    def flush(self) -> None:
        """Hand what is gathered to `run` now (the turn's callback; also for a shutdown that cannot wait)."""
        items, self._items = self._items, []
        if items:
            self._run(items)
