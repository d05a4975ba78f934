"""Waiting inside a running loop for a condition, rather than for a guessed time."""

from __future__ import annotations

import asyncio
from collections.abc import Callable


async def until(condition: Callable[[], bool], timeout: float = 30.0) -> None:
    """Return once `condition()` holds, checking every few milliseconds; fail after `timeout` (only a broken
    condition takes that long, so a busy machine does not fail the test)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not condition():
        assert loop.time() < deadline, "condition not met in time"
        await asyncio.sleep(0.005)
