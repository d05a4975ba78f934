"""Cancel the task serving a request when its client disconnects.

One watcher task per request, cancelling the serving task, rather than Starlette's way for streams (a task
group per response: measured at tens of microseconds a request) or `asyncio.wait` over two tasks. The
cancellation it causes is told apart from any other (a shutdown's) by `gone()`, which also takes it back.

The watcher is never cancelled itself. A cancelled task leaves a `CancelledError` whose traceback holds the
task's frames, a reference cycle that only the cyclic garbage collector frees, and it keeps everything the
request touched alive until then: with one per request that was most of the collector's work under load.
Instead the watcher outlives the watch and ends by itself, because an ASGI server answers a pending
`receive()` with `http.disconnect` once the response is complete (uvicorn wakes it in its final `send`).
"""

from __future__ import annotations

import asyncio
from typing import Any

from starlette.types import Receive


class DisconnectWatch:
    """Watches `receive` for the task that makes it; use as a context manager around the serving."""

    def __init__(self, receive: Receive) -> None:
        self._task: asyncio.Task[Any] = asyncio.current_task()  # type: ignore[assignment]  # always in a request's task
        self._watching = True
        self._watcher = asyncio.ensure_future(self._watch(receive))

    def __enter__(self) -> DisconnectWatch:
        return self

    def __exit__(self, *exc: object) -> None:
        self._watching = False  # a disconnect from now on is the response's own end, or too late to matter

    def gone(self) -> bool:
        """Whether the client left and cancelled the task; if so the cancellation is taken back (`uncancel`),
        so the caller can finish normally."""
        watcher = self._watcher
        if not watcher.done() or watcher.cancelled() or watcher.exception() is not None:
            return False
        self._task.uncancel()
        return True

    async def _watch(self, receive: Receive) -> None:
        while (await receive())["type"] != "http.disconnect":
            pass
        if self._watching:
            self._task.cancel()
