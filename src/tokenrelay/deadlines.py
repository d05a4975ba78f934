"""Coarse timers for deadlines that almost never fire: one loop timer per `RESOLUTION` of loop time.

Every node exchange waits under a deadline (first byte, idle gap, overall limit) and every request's
disconnect watcher starts after a delay; each was a loop timer armed and then cancelled, 2.1-3.4 us apiece
with uvloop (a libuv timer made, started, stopped and closed; measured here), for a few of them per relayed
request. Here a deadline joins the slot its time falls in: the first deadline of a slot arms the slot's one
loop timer, for the slot's end, and cancelling a deadline only takes it out of its slot. A busy server arms
about a hundred loop timers a second this way instead of one per deadline, and a deadline fires at most
`RESOLUTION` late: nothing against limits of seconds, or a watcher meant to start "after about 50 ms".
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

RESOLUTION = 0.01  # seconds

Slot = dict["Alarm", tuple[Callable[[Any], None], Any]]


class Alarm:
    """One deadline; `cancel()` it once it no longer matters."""

    __slots__ = ("_slot",)

    def __init__(self, slot: Slot) -> None:
        self._slot: Slot | None = slot

    def cancel(self) -> None:
        slot = self._slot
        if slot is not None:
            slot.pop(self, None)
            self._slot = None


class Deadlines:
    """Deadlines on the running loop (a new loop, as in tests, starts afresh: the old one's are dropped)."""

    def __init__(self) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None
        self._slots: dict[int, Slot] = {}

    def call_at(self, when: float, callback: Callable[[Any], None], argument: Any) -> Alarm:
        """`callback(argument)` at loop time `when`, or up to `RESOLUTION` later, unless cancelled first."""
        loop = asyncio.get_running_loop()
        if loop is not self._loop:
            self._loop, self._slots = loop, {}
        number = int(when / RESOLUTION) + 1  # the slot ends at number * RESOLUTION, at or after `when`
        slot = self._slots.get(number)
        if slot is None:
            slot = self._slots[number] = {}
            loop.call_at(number * RESOLUTION, self._fire, number)
        alarm = Alarm(slot)
        slot[alarm] = (callback, argument)
        return alarm

    def _fire(self, number: int) -> None:
        slot = self._slots.pop(number, None)
        if not slot:
            return
        due = list(slot.values())
        for alarm in slot:
            alarm._slot = None
        slot.clear()
        for callback, argument in due:
            try:
                callback(argument)
            except Exception as exc:  # as the loop reports a failing callback, without skipping the others
                asyncio.get_running_loop().call_exception_handler(
                    {"message": "deadline callback failed", "exception": exc}
                )
