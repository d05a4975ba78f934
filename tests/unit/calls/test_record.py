"""`observed`: a backend's events recorded on the call, and what a backend cut short reports on its ticket."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from tokenrelay.backends.base import Events, TextDelta, Ticket, Usage
from tokenrelay.calls.record import Call, observed


def generation(ticket: Ticket, tokens: int) -> AsyncIterator[Events]:
    """A backend's generation that, closed before its end, puts what it consumed on the ticket."""

    async def events() -> AsyncIterator[Events]:
        produced = 0
        try:
            for _ in range(tokens):
                produced += 1
                yield [TextDelta(index=0, text="x")]
            yield [Usage(prompt_tokens=7, completion_tokens=produced)]
        finally:
            if produced < tokens or tokens == 0:
                ticket.consumed = Usage(prompt_tokens=7, completion_tokens=produced)

    return events()


async def read(events: AsyncIterator[Events], batches: int) -> None:
    for _ in range(batches):
        await anext(events)
    await events.aclose()  # type: ignore[attr-defined]


def test_a_generation_closed_early_is_billed_what_the_backend_reports_on_the_ticket() -> None:
    call = Call(request_id="r", endpoint="chat.completions", model="m")
    asyncio.run(read(observed(generation(call.ticket, 10), call), 3))
    assert (call.usage.prompt_tokens, call.usage.completion_tokens, call.usage.estimated) == (7, 3, False)
    assert call.ended is not None


def test_a_generation_read_to_its_end_keeps_its_own_usage_event() -> None:
    call = Call(request_id="r", endpoint="chat.completions", model="m")
    asyncio.run(read(observed(generation(call.ticket, 2), call), 3))
    assert call.ticket.consumed is None
    assert (call.usage.prompt_tokens, call.usage.completion_tokens) == (7, 2)


def test_without_a_report_a_cut_generation_is_estimated_from_its_events() -> None:
    call = Call(request_id="r", endpoint="chat.completions", model="m")

    async def silent() -> AsyncIterator[Events]:
        for _ in range(5):
            yield [TextDelta(index=0, text="x")]

    asyncio.run(read(observed(silent(), call), 2))
    assert (call.usage.completion_tokens, call.usage.estimated) == (2, True)
