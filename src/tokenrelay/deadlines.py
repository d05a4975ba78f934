"""Coarse timers for deadlines that almost never fire: one loop timer per slot of loop time, not per deadline.

Every node exchange waits under a deadline (first byte, idle gap, overall limit) and every request's
disconnect watcher starts after a delay; each was a loop timer armed and then cancelled, 2.1-3.4 us apiece
with uvloop (a libuv timer made, started, stopped and closed; measured here), for a few of them per relayed
request. Here a deadline joins the slot its time falls in: the first deadline of a slot arms the slot's one
loop timer, for the slot's end, and cancelling a deadline only takes it out of its slot. Slots are `RESOLUTION`
wide for deadlines up to two seconds ahead and wider the further ahead a deadline is (a power of two times
`RESOLUTION`, at most a hundredth of the wait), so a deadline fires at most `RESOLUTION` or 1% of its wait late
(a watcher meant to start "after about 50 ms", a 900 s limit up to 9 s late) and the slots alive at once stay
few: one to two hundred per width in use, however busy the server, instead of a loop timer per
deadline (several thousand a second).
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable
from typing import Any

RESOLUTION = 0.01  # seconds

Slot = dict["Alarm", tuple[Callable[[Any], None], Any]]


def slot_of(when: float, now: float) -> tuple[tuple[int, int], float]:
    """The slot of a deadline at `when` set at `now`, as (its width's exponent, its number), and its end."""
    ahead = when - now
    exponent = 0 if ahead < 200 * RESOLUTION else math.frexp(ahead / (100 * RESOLUTION))[1] - 1
    width = math.ldexp(RESOLUTION, exponent)
    number = int(when / width) + 1  # the slot ends at number * width, at or after `when`
    return (exponent, number), number * width


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
        self._slots: dict[tuple[int, int], Slot] = {}

    def call_at(self, when: float, callback: Callable[[Any], None], argument: Any) -> Alarm:
        """`callback(argument)` at loop time `when`, or a little later (see `slot_of`), unless cancelled first."""
        loop = asyncio.get_running_loop()
        if loop is not self._loop:
            self._loop, self._slots = loop, {}
        key, end = slot_of(when, loop.time())
        slot = self._slots.get(key)
        if slot is None:
            slot = self._slots[key] = {}
            loop.call_at(end, self._fire, key)
        alarm = Alarm(slot)
        slot[alarm] = (callback, argument)
        return alarm

    def _fire(self, key: tuple[int, int]) -> None:
        slot = self._slots.pop(key, None)
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
