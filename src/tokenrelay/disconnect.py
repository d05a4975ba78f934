"""Cancel the task serving a request when its client disconnects.

One watcher task per request, cancelling the serving task, rather than Starlette's way for streams (a task
group per response: measured at tens of microseconds a request) or `asyncio.wait` over two tasks. The
cancellation it causes is told apart from any other (a shutdown's) by `gone()`, which also takes it back.
"""

from __future__ import annotations

import asyncio
from typing import Any

from starlette.types import Receive


class DisconnectWatch:
    """Watches `receive` while the current task serves; use as a context manager around the serving."""

    def __init__(self, receive: Receive) -> None:
        self._receive = receive
        self._task: asyncio.Task[Any] | None = None
        self._watcher: asyncio.Task[None] | None = None

    def __enter__(self) -> DisconnectWatch:
        self._task = asyncio.current_task()
        self._watcher = asyncio.ensure_future(self._watch())
        return self

    def __exit__(self, *exc: object) -> None:
        if self._watcher is not None:
            self._watcher.cancel()

    def gone(self) -> bool:
        """Whether the client left and cancelled the task; if so the cancellation is taken back (`uncancel`),
        so the caller can finish normally."""
        watcher = self._watcher
        if watcher is None or not watcher.done() or watcher.cancelled() or watcher.exception() is not None:
            return False
        assert self._task is not None
        self._task.uncancel()
        return True

    async def _watch(self) -> None:
        while (await self._receive())["type"] != "http.disconnect":
            pass
        assert self._task is not None
        self._task.cancel()
