"""`DisconnectWatch`: cancels the serving task when the client leaves, and is never cancelled itself."""

from __future__ import annotations

import asyncio
import gc

from event_loops import ON_BOTH_LOOPS
from tokenrelay.deadlines import Deadlines
from tokenrelay.disconnect import WATCH_AFTER_SECONDS, DisconnectWatch

pytestmark = ON_BOTH_LOOPS


class Peer:
    """An ASGI `receive` whose connection ends when `leave()` is called (or the response completes)."""

    def __init__(self) -> None:
        self._ended = asyncio.Event()

    async def receive(self) -> dict[str, str]:
        await self._ended.wait()
        return {"type": "http.disconnect"}

    def leave(self) -> None:
        self._ended.set()


def serving(peer: Peer, outcome: list[str]) -> asyncio.Task[None]:
    """A request's task waiting under a watch; notes whether its cancellation was the client leaving."""

    async def serve() -> None:
        with DisconnectWatch(peer.receive, Deadlines()) as watch:
            try:
                await asyncio.sleep(10)
            except asyncio.CancelledError:
                if not watch.gone():
                    outcome.append("cancelled")
                    raise
                outcome.append("gone")

    return asyncio.create_task(serve())


async def test_a_client_leaving_during_the_watch_cancels_the_serving_task() -> None:
    peer, outcome = Peer(), []
    task = serving(peer, outcome)
    await asyncio.sleep(0.01)
    peer.leave()
    await asyncio.wait_for(task, 1)
    assert outcome == ["gone"]
    assert not task.cancelled() and task.cancelling() == 0  # taken back: the task finished normally


async def test_a_shutdown_cancellation_is_not_mistaken_for_a_client_leaving() -> None:
    peer, outcome = Peer(), []
    task = serving(peer, outcome)
    await asyncio.sleep(0.01)
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    assert outcome == ["cancelled"] and task.cancelled()


async def test_after_the_watch_the_watcher_ends_by_itself_without_cancelling_anything() -> None:
    peer = Peer()
    watchers: list[asyncio.Future[None]] = []

    async def serve() -> str:
        with DisconnectWatch(peer.receive, Deadlines()) as watch:
            await asyncio.sleep(WATCH_AFTER_SECONDS + 0.02)  # long enough for the watcher to start
            watchers.append(watch._watcher)
        await asyncio.sleep(0.01)  # the response goes out after the watch
        peer.leave()  # the server answers the pending receive once the response is complete
        await asyncio.sleep(0.01)
        return "served"

    assert await asyncio.wait_for(serve(), 1) == "served"
    watcher = watchers[0]
    assert watcher.done() and not watcher.cancelled()  # no CancelledError, so no traceback cycle is left


async def test_a_client_that_left_before_the_watcher_started_is_noticed_when_it_starts() -> None:
    peer, outcome = Peer(), []
    peer.leave()  # gone at once: the watcher's first `receive()` answers straight away
    started = asyncio.get_running_loop().time()
    task = serving(peer, outcome)
    await asyncio.wait_for(task, 1)
    took = asyncio.get_running_loop().time() - started
    assert outcome == ["gone"]
    assert WATCH_AFTER_SECONDS * 0.9 <= took < WATCH_AFTER_SECONDS + 0.5


async def test_a_short_watch_starts_no_watcher_task() -> None:
    peer = Peer()
    before = len(asyncio.all_tasks())
    with DisconnectWatch(peer.receive, Deadlines()) as watch:
        await asyncio.sleep(0)
        during = len(asyncio.all_tasks())
    await asyncio.sleep(WATCH_AFTER_SECONDS + 0.02)  # the cancelled timer never fires
    assert during == before and watch._watcher is None
    assert len(asyncio.all_tasks()) == before


async def test_a_watched_request_leaves_no_cyclic_garbage() -> None:
    async def serve(watch_for: float) -> None:
        peer = Peer()
        with DisconnectWatch(peer.receive, Deadlines()):
            await asyncio.sleep(watch_for)
        peer.leave()
        await asyncio.sleep(0.01)

    gc.collect()
    gc.disable()
    try:
        await serve(0)  # over before the watcher starts
        await serve(WATCH_AFTER_SECONDS + 0.02)  # with a watcher, which ends by itself
        assert gc.collect() == 0  # everything the requests made was freed by reference counting alone
    finally:
        gc.enable()
