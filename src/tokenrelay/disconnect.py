"""Cancel the task serving a request when its client disconnects.

One watcher task per request, cancelling the serving task, rather than Starlette's way for streams (a task
group per response: measured at tens of microseconds a request) or `asyncio.wait` over two tasks. The
cancellation it causes is told apart from any other (a shutdown's) by `gone()`, which also takes it back.

The watcher is never cancelled itself. A cancelled task leaves a `CancelledError` whose traceback holds the
task's frames, a reference cycle that only the cyclic garbage collector frees, and it keeps everything the
request touched alive until then: with one per request that was most of the collector's work under load.
Instead the watcher outlives the watch and ends by itself, because an ASGI server answers a pending
`receive()` with `http.disconnect` once the response is complete (uvicorn wakes it in its final `send`).

The watcher starts only once the watch has lasted `WATCH_AFTER_SECONDS`: a task per request (made, run,
woken again when the response completes) is measurable CPU on a relay's hot path, and most relayed answers
are complete by then. A
client that leaves sooner is noticed when the watcher starts (its `receive()` answers at once), so a
generation goes on at most that long after its client has gone: nothing against the seconds a model takes.
"""

from __future__ import annotations

import asyncio
from typing import Any

from starlette.types import Receive

from tokenrelay.deadlines import Alarm, Deadlines

WATCH_AFTER_SECONDS = 0.05


class DisconnectWatch:
    """Watches `receive` for the task that makes it; use as a context manager around the serving."""

    def __init__(self, receive: Receive, deadlines: Deadlines) -> None:
        """`deadlines`: the server's (`Services.deadlines`), which start the watcher about
        `WATCH_AFTER_SECONDS` from now (a coarse timer: see `tokenrelay.deadlines`)."""
        self._task: asyncio.Task[Any] = asyncio.current_task()  # type: ignore[assignment]  # always in a request's task
        self._receive = receive
        self._watching = True
        self._watcher: asyncio.Task[None] | None = None
        start = self._task.get_loop().time() + WATCH_AFTER_SECONDS
        self._timer: Alarm | None = deadlines.call_at(start, DisconnectWatch._start, self)

    def __enter__(self) -> DisconnectWatch:
        return self

    def __exit__(self, *exc: object) -> None:
        self._watching = False  # a disconnect from now on is the response's own end, or too late to matter
        if self._timer is not None:
            self._timer.cancel()  # a cancelled alarm drops its callback: no reference to this watch is left
            self._timer = None

    def _start(self) -> None:
        self._timer = None
        self._watcher = self._task.get_loop().create_task(self._watch(self._receive))

    def gone(self) -> bool:
        """Whether the client left and cancelled the task; if so the cancellation is taken back (`uncancel`),
        so the caller can finish normally."""
        watcher = self._watcher
        if watcher is None or not watcher.done() or watcher.cancelled() or watcher.exception() is not None:
            return False
        self._task.uncancel()
        return True

    async def _watch(self, receive: Receive) -> None:
        while (await receive())["type"] != "http.disconnect":
            pass
        if self._watching:
            self._task.cancel()
