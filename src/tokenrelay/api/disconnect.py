"""Stop the work serving a request when its client disconnects.

Modelled on vLLM's `listen_for_disconnect`: a task reads the request's `receive` until the server reports
the disconnect. It then cancels the serving task the way `asyncio.timeout` does when time is up, and the
watched block raises `ClientGone` in place of that cancellation.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from contextlib import contextmanager

from starlette.types import Receive

from tokenrelay.calls.record import ClientGone

LISTEN_AFTER_SECONDS = 0.05


async def listen_for_disconnect(receive: Receive) -> None:
    """Returns once the client has disconnected (or the response is complete: a server reports that alike)."""
    while (await receive())["type"] != "http.disconnect":
        pass


@contextmanager
def cancel_on_disconnect(receive: Receive) -> Iterator[None]:
    """Cancels the block if the client leaves; the block then raises `ClientGone`. Any other cancellation
    (a shutdown's) goes through as it is."""
    task = asyncio.current_task()
    assert task is not None  # always inside a request's task
    cancelling = task.cancelling()
    gone = False

    async def listen() -> None:
        nonlocal gone
        await listen_for_disconnect(receive)
        gone = True
        task.cancel()

    listener: asyncio.Task[None] | None = None

    def start() -> None:
        nonlocal listener
        listener = asyncio.create_task(listen())

    # Most answers are complete within a few tens of milliseconds, so the listener (a task, woken again when
    # the response ends) is only started for those that take longer; a client that left sooner is noticed the
    # moment it starts, since `receive()` then answers at once.
    timer = task.get_loop().call_later(LISTEN_AFTER_SECONDS, start)
    try:
        yield
    finally:
        timer.cancel()
        if listener is not None:
            listener.cancel()
        # As in `asyncio.timeout`: the cancellation is taken back, and becomes ClientGone unless another is pending.
        if gone and task.uncancel() <= cancelling:
            raise ClientGone from None
