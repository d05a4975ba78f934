"""`Deadlines`: coarse timers that fire at or up to one resolution after their time, unless cancelled."""

from __future__ import annotations

import asyncio

from event_loops import on_both_loops
from tokenrelay.deadlines import RESOLUTION, Deadlines, slot_of


@on_both_loops
async def test_a_deadline_fires_at_its_time_or_within_one_resolution_after() -> None:
    loop = asyncio.get_running_loop()
    deadlines, fired = Deadlines(), asyncio.Event()
    when = loop.time() + 0.05
    at: list[float] = []

    def note(_: object) -> None:
        at.append(loop.time())
        fired.set()

    deadlines.call_at(when, note, None)
    await asyncio.wait_for(fired.wait(), 1)
    assert when <= at[0] < when + RESOLUTION + 0.05  # the slot's end, give or take a busy machine's delay


@on_both_loops
async def test_a_cancelled_deadline_never_fires_and_its_neighbours_still_do() -> None:
    loop = asyncio.get_running_loop()
    deadlines, fired = Deadlines(), []
    when = loop.time() + 0.02
    kept = deadlines.call_at(when, fired.append, "kept")
    deadlines.call_at(when, fired.append, "cancelled").cancel()
    await asyncio.sleep(0.02 + 2 * RESOLUTION + 0.02)
    assert fired == ["kept"]
    kept.cancel()  # after firing: nothing to take back, no error


@on_both_loops
async def test_deadlines_of_one_slot_share_one_loop_timer() -> None:
    loop = asyncio.get_running_loop()
    deadlines, fired = Deadlines(), []
    start = (int(loop.time() / RESOLUTION) + 5) * RESOLUTION  # the start of a slot a little ahead
    for i in range(100):
        deadlines.call_at(start + RESOLUTION * 0.5 + i * 1e-5, fired.append, i)
    assert len(deadlines._slots) == 1
    await asyncio.sleep(start - loop.time() + 2 * RESOLUTION + 0.02)
    assert fired == list(range(100))  # in the order they were made
    assert deadlines._slots == {}


@on_both_loops
async def test_a_failing_callback_does_not_keep_the_others_of_its_slot_from_firing() -> None:
    loop = asyncio.get_running_loop()
    reported: list[dict[str, object]] = []
    loop.set_exception_handler(lambda _, context: reported.append(context))
    try:
        deadlines, fired = Deadlines(), []
        when = loop.time() + 0.01

        def fail(_: object) -> None:
            raise RuntimeError("boom")

        deadlines.call_at(when, fail, None)
        deadlines.call_at(when, fired.append, "after")
        await asyncio.sleep(0.01 + 2 * RESOLUTION + 0.02)
        assert fired == ["after"]
        assert isinstance(reported[0]["exception"], RuntimeError)
    finally:
        loop.set_exception_handler(None)


@on_both_loops
async def test_a_callback_may_cancel_another_deadline_of_its_own_slot() -> None:
    loop = asyncio.get_running_loop()
    deadlines, fired = Deadlines(), []
    when = loop.time() + 0.01
    second = None

    def first(_: object) -> None:
        fired.append("first")
        assert second is not None
        second.cancel()  # too late: the slot's deadlines are all due together

    deadlines.call_at(when, first, None)
    second = deadlines.call_at(when, fired.append, "second")
    await asyncio.sleep(0.01 + 2 * RESOLUTION + 0.02)
    assert fired == ["first", "second"]


def test_a_deadline_far_ahead_fires_at_most_a_hundredth_of_its_wait_late_and_far_ones_share_few_slots() -> None:
    now = 10_000.0
    for ahead in (0.001, 0.05, 1.99, 2.0, 7.3, 60.0, 120.0, 900.0, 86_400.0):
        _, end = slot_of(now + ahead, now)
        assert now + ahead <= end <= now + ahead + max(RESOLUTION, ahead / 100)
    # A busy server's 900 s limits, one made every millisecond for a minute, and its 60 s gaps likewise.
    keys = {slot_of(now + t / 1000 + limit, now + t / 1000)[0] for t in range(60_000) for limit in (60.0, 900.0)}
    assert len(keys) < 400  # against 120,000 loop timers, one per deadline
