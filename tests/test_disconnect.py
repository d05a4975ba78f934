"""`DisconnectWatch`: cancels the serving task when the client leaves, and is never cancelled itself."""

from __future__ import annotations

import asyncio
import gc

from event_loops import ON_BOTH_LOOPS
from tokenrelay.disconnect import DisconnectWatch

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
        with DisconnectWatch(peer.receive) as watch:
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
        with DisconnectWatch(peer.receive) as watch:
            watchers.append(watch._watcher)
        await asyncio.sleep(0.01)  # the response goes out after the watch
        peer.leave()  # the server answers the pending receive once the response is complete
        await asyncio.sleep(0.01)
        return "served"

    assert await asyncio.wait_for(serve(), 1) == "served"
    watcher = watchers[0]
    assert watcher.done() and not watcher.cancelled()  # no CancelledError, so no traceback cycle is left


async def test_a_watched_request_leaves_no_cyclic_garbage() -> None:
    peer = Peer()

    async def serve() -> None:
        with DisconnectWatch(peer.receive):
            await asyncio.sleep(0)
        peer.leave()
        await asyncio.sleep(0.01)

    gc.collect()
    gc.disable()
    try:
        await serve()
        assert gc.collect() == 0  # everything the request made was freed by reference counting alone
    finally:
        gc.enable()
