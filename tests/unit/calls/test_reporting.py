"""`FinishedCalls`: a loop turn's finished calls reach every observer, once each, observer by observer."""

from __future__ import annotations

import asyncio
import logging

import pytest
from event_loops import on_both_loops

from tokenrelay.calls.record import Call
from tokenrelay.calls.reporting import FinishedCalls, Observer
from tokenrelay.server.write_batching import TurnBufferedTransport


def calls(n: int) -> list[Call]:
    return [Call(request_id=f"r{i}", endpoint="chat.completions", model="m") for i in range(n)]


def recording(seen: list[tuple[str, str]], name: str) -> Observer:
    return lambda call: seen.append((name, call.request_id))


@on_both_loops
async def test_the_calls_of_a_turn_are_reported_in_the_next_turn_observer_by_observer() -> None:
    seen: list[tuple[str, str]] = []
    finished = FinishedCalls([recording(seen, "log"), recording(seen, "ledger")])
    for call in calls(3):
        finished.add(call)
    assert seen == []  # not inside the request's own turn
    await asyncio.sleep(0)
    assert seen == [("log", "r0"), ("log", "r1"), ("log", "r2"), ("ledger", "r0"), ("ledger", "r1"), ("ledger", "r2")]
    finished.add(calls(1)[0])
    await asyncio.sleep(0)
    assert seen[-2:] == [("log", "r0"), ("ledger", "r0")]  # a later turn's calls get a report of their own


class RecordingTransport:
    """The socket's transport, as far as a held write's flush sees it."""

    def __init__(self, order: list[str]) -> None:
        self.order = order

    def is_closing(self) -> bool:
        return False

    def write(self, data: bytes) -> None:
        self.order.append(f"sent {data.decode()}")


@on_both_loops
async def test_a_write_held_before_a_call_is_reported_goes_out_before_its_observers_run() -> None:
    """What lets a call be reported after its response's last write (`api.lifecycle.Ending`): the held
    write's flush was queued first, so the bytes leave before the log line, metrics and ledger row are made."""
    order: list[str] = []
    transport = TurnBufferedTransport(RecordingTransport(order), asyncio.get_running_loop())  # type: ignore[arg-type]
    finished = FinishedCalls([lambda call: order.append(f"observed {call.request_id}")])
    transport.write(b"last chunk")
    finished.add(calls(1)[0])
    await asyncio.sleep(0)
    assert order == ["sent last chunk", "observed r0"]


@on_both_loops
async def test_a_failing_observer_costs_no_other_call_or_observer_its_report(
    caplog: pytest.LogCaptureFixture,
) -> None:
    seen: list[tuple[str, str]] = []

    def failing(call: Call) -> None:
        if call.request_id == "r0":
            raise RuntimeError("boom")
        seen.append(("metrics", call.request_id))

    finished = FinishedCalls([failing, recording(seen, "ledger")])
    with caplog.at_level(logging.ERROR, logger="tokenrelay.calls.reporting"):
        for call in calls(2):
            finished.add(call)
        await asyncio.sleep(0)
    assert seen == [("metrics", "r1"), ("ledger", "r0"), ("ledger", "r1")]
    assert "reporting a finished call failed" in caplog.text


@on_both_loops
async def test_flush_reports_what_is_gathered_at_once_and_the_turn_finds_nothing_left() -> None:
    seen: list[tuple[str, str]] = []
    finished = FinishedCalls([recording(seen, "ledger")])
    for call in calls(2):
        finished.add(call)
    finished.flush()  # what a shutdown does before the ledger's last write
    assert seen == [("ledger", "r0"), ("ledger", "r1")]
    await asyncio.sleep(0)
    assert len(seen) == 2


def test_outside_a_running_loop_a_call_is_reported_at_once() -> None:
    seen: list[tuple[str, str]] = []
    finished = FinishedCalls([recording(seen, "log"), recording(seen, "ledger")])
    finished.add(calls(1)[0])
    assert seen == [("log", "r0"), ("ledger", "r0")]
