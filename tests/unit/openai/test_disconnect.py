"""A client that disconnects stops the generation behind its request, streamed or not."""

from __future__ import annotations

import asyncio
import gc
from collections.abc import AsyncIterator
from typing import Any

from event_loops import ON_BOTH_LOOPS

from tokenrelay.api.disconnect import cancel_on_disconnect
from tokenrelay.api.lifecycle import Ending, streamed
from tokenrelay.api.sse import OPENAI
from tokenrelay.backends.base import Events, TextDelta
from tokenrelay.calls.record import ClientGone
from tokenrelay.openai.chat.render import ChatChunker
from tokenrelay.openai.render import ResponseMeta

pytestmark = ON_BOTH_LOOPS

META = ResponseMeta(id="chatcmpl-1", created=0, model="m", system_fingerprint="fp", choices=1)
SCOPE = {"type": "http", "asgi": {"version": "3.0", "spec_version": "2.3"}}  # as uvicorn's scope says


class Peer:
    """An ASGI `receive` whose connection ends when `leave()` is called (or the response completes)."""

    def __init__(self) -> None:
        self._ended = asyncio.Event()

    async def receive(self) -> dict[str, str]:
        await self._ended.wait()
        return {"type": "http.disconnect"}

    def leave(self) -> None:
        self._ended.set()


async def watched(peer: Peer, outcome: list[str], seconds: float = 10) -> None:
    """A request's work under the watch; notes how it ended."""
    try:
        with cancel_on_disconnect(peer.receive):
            try:
                await asyncio.sleep(seconds)
            except asyncio.CancelledError:
                outcome.append("cancelled")
                raise
            outcome.append("done")
    except ClientGone:
        outcome.append("gone")


async def test_a_client_leaving_cancels_the_block_which_raises_client_gone() -> None:
    peer, outcome = Peer(), []
    asyncio.get_running_loop().call_later(0.01, peer.leave)
    task = asyncio.create_task(watched(peer, outcome))
    await asyncio.wait_for(task, 1)
    assert outcome == ["cancelled", "gone"]  # the work unwound before `ClientGone` reached the caller
    assert not task.cancelled() and task.cancelling() == 0  # taken back: the task goes on normally


async def test_a_block_that_ends_first_leaves_no_task_behind() -> None:
    peer, outcome = Peer(), []
    before = len(asyncio.all_tasks())
    await watched(peer, outcome, seconds=0.01)
    await asyncio.sleep(0)  # the listener's cancellation is delivered
    assert outcome == ["done"] and len(asyncio.all_tasks()) == before
    peer.leave()  # too late to matter
    await asyncio.sleep(0.01)
    assert outcome == ["done"]


async def test_a_shutdown_cancellation_is_not_mistaken_for_a_client_leaving() -> None:
    peer, outcome = Peer(), []
    task = asyncio.create_task(watched(peer, outcome))
    await asyncio.sleep(0.01)
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    assert outcome == ["cancelled"] and task.cancelled()


async def test_a_watched_request_leaves_no_cyclic_garbage() -> None:
    """Whether its client stays or leaves (the collector's tuning counts on requests freeing by reference counting)."""

    async def served(leave: bool) -> None:
        peer = Peer()
        if leave:
            asyncio.get_running_loop().call_later(0.001, peer.leave)
        await watched(peer, [], seconds=0.005)

    await served(False)
    await served(True)
    gc.collect()
    gc.disable()
    try:
        await served(False)
        await served(True)
        assert gc.collect() == 0
    finally:
        gc.enable()


async def test_a_client_leaving_mid_stream_cancels_the_generation_and_reports_once() -> None:
    peer, outcome = Peer(), []
    reports: list[list[str]] = []

    async def engine() -> AsyncIterator[Events]:
        try:
            yield [TextDelta(0, "one")]
            await asyncio.sleep(10)  # generating the next token when the client leaves
            yield [TextDelta(0, " two")]
        except asyncio.CancelledError:
            outcome.append("cancelled")
            raise

    sent: list[dict[str, Any]] = []

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)
        if message["type"] == "http.response.body":
            asyncio.get_running_loop().call_later(0.01, peer.leave)

    response = Ending(
        await streamed(ChatChunker(META, want_logprobs=False).chunks(engine()), OPENAI, peer.receive),
        lambda: reports.append(outcome[:]),
    )
    await asyncio.wait_for(response(SCOPE, peer.receive, send), 1)
    assert outcome == ["cancelled"] and reports == [["cancelled"]]
    assert [m["type"] for m in sent] == ["http.response.start", "http.response.body"]  # the opening with "one"


async def test_a_client_leaving_while_a_write_waits_closes_the_generation_before_the_report() -> None:
    peer, closed = Peer(), []
    reports: list[list[str]] = []

    async def engine() -> AsyncIterator[Events]:
        try:
            for word in ("one", " two"):
                yield [TextDelta(0, word)]
        finally:
            closed.append("closed")

    async def stuck(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.body":
            peer.leave()
            await asyncio.sleep(10)  # a client that reads nothing: the server's write waits

    response = Ending(
        await streamed(ChatChunker(META, want_logprobs=False).chunks(engine()), OPENAI, peer.receive),
        lambda: reports.append(closed[:]),
    )
    await asyncio.wait_for(response(SCOPE, peer.receive, stuck), 1)
    assert reports == [["closed"]]
