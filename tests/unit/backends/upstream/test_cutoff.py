"""The client's token limit through a node: asked of the node as `max_tokens`, and enforced on an answer that runs
past it (a node that ignores the field), so that the client never receives nor pays for more."""

from __future__ import annotations

import asyncio

import pytest
from aiohttp import web
from upstream_fakes import (
    ON_ASYNCIO,
    FakeNodes,
    Stream,
    answer,
    chat,
    chat_body,
    chunk,
    completion,
    drain,
    event_stream,
    nodes_fixture,
    sse,
    text_of,
    usage_chunk,
)

from tokenrelay.backends.base import Finish, TextDelta, TextRun, Ticket, TokenLogprob, Usage
from tokenrelay.backends.tokens import ApproxCounter
from tokenrelay.backends.upstream.cutoff import Cutoff

pytestmark = ON_ASYNCIO
nodes = nodes_fixture()

WORDS = [f"w{i} " for i in range(50)]


def runaway(choices: int = 1) -> bytes:
    """A node that streams 50 one-token chunks per choice whatever it was asked, then its usage."""
    chunks = [chunk(word, index=i) for word in WORDS for i in range(choices)]
    finishes = [chunk(finish="stop", index=i) for i in range(choices)]
    return sse(*chunks, *finishes, usage_chunk(9, 50 * choices))


def finishes(events: list[object]) -> list[Finish]:
    return [event for event in events if isinstance(event, Finish)]


@pytest.mark.parametrize("field", ["max_tokens", "max_completion_tokens"])
async def test_the_node_is_asked_for_max_tokens(nodes: FakeNodes, field: str) -> None:
    nodes.on("a", answer(lambda: web.json_response(chat_body("hi"))))
    await drain(nodes.backend("a").chat(chat(**{field: 5}), Ticket("rid")))
    [body] = nodes.bodies("a")
    assert body["max_tokens"] == 5 and "max_completion_tokens" not in body


async def test_completions_ask_for_the_documented_default_of_16(nodes: FakeNodes) -> None:
    nodes.on("a", answer(lambda: web.json_response({"choices": [{"index": 0, "text": "x", "finish_reason": "stop"}]})))
    await drain(nodes.backend("a").complete(completion(), Ticket("rid")))
    assert nodes.bodies("a")[0]["max_tokens"] == 16


@pytest.mark.parametrize("choices", [1, 2])
async def test_a_stream_that_runs_past_the_limit_is_cut_and_billed_at_the_limit(nodes: FakeNodes, choices: int) -> None:
    stream = Stream([runaway(choices)[i : i + 200] for i in range(0, len(runaway(choices)), 200)], pause=0.001)
    nodes.on("a", stream.respond)
    events = await drain(nodes.backend("a").chat(chat(stream=True, max_tokens=5, n=choices), Ticket("rid")))
    for index in range(choices):
        mine = [e for e in events if isinstance(e, TextDelta | TextRun) and e.index == index]
        assert text_of(mine) == "".join(WORDS[:5])
    assert finishes(events) == [Finish(i, "length") for i in range(choices)]
    usage = events[-1]
    assert isinstance(usage, Usage) and usage.completion_tokens == 5 * choices
    await asyncio.wait_for(stream.abandoned.wait(), 5)  # the gateway stopped reading: the node is told to stop
    assert stream.sent < len(stream.parts)


async def test_a_node_that_honours_the_limit_is_passed_through(nodes: FakeNodes) -> None:
    body = sse(*[chunk(word) for word in WORDS[:5]], chunk(finish="length"), usage_chunk(9, 5))
    nodes.on("a", answer(lambda: event_stream(body)))
    events = await drain(nodes.backend("a").chat(chat(stream=True, max_tokens=5), Ticket("rid")))
    assert text_of(events) == "".join(WORDS[:5])
    assert finishes(events) == [Finish(0, "length")] and events[-1] == Usage(9, 5, 0)


async def test_an_answer_that_stops_at_the_limit_keeps_the_nodes_finish(nodes: FakeNodes) -> None:
    body = sse(*[chunk(word) for word in WORDS[:5]], chunk(finish="stop"), usage_chunk(9, 5))
    nodes.on("a", answer(lambda: event_stream(body)))
    events = await drain(nodes.backend("a").chat(chat(stream=True, max_tokens=5), Ticket("rid")))
    assert finishes(events) == [Finish(0, "stop")]


async def test_a_whole_answer_past_the_limit_is_cut_to_it(nodes: FakeNodes) -> None:
    usage = {"prompt_tokens": 9, "completion_tokens": 50, "total_tokens": 59}
    nodes.on("a", answer(lambda: web.json_response(chat_body("".join(WORDS), usage))))
    backend = nodes.backend("a")
    events = await drain(backend.chat(chat(max_tokens=5), Ticket("rid")))
    text = text_of(events)
    assert text and "".join(WORDS).startswith(text) and backend.counter.count(text) <= 5
    assert finishes(events) == [Finish(0, "length")]
    assert events[-1] == Usage(9, 5, 0)


async def test_a_whole_answer_within_the_limit_is_untouched(nodes: FakeNodes) -> None:
    usage = {"prompt_tokens": 9, "completion_tokens": 4, "total_tokens": 13}
    nodes.on("a", answer(lambda: web.json_response(chat_body("one two", usage))))
    events = await drain(nodes.backend("a").chat(chat(max_tokens=5), Ticket("rid")))
    assert text_of(events) == "one two" and finishes(events) == [Finish(0, "stop")] and events[-1] == Usage(9, 4, 0)


async def test_logprob_entries_count_one_token_each() -> None:
    cutoff = Cutoff(chat(max_tokens=3, logprobs=True), ApproxCounter())
    entries = [TokenLogprob(f"t{i}", -0.1, None, []) for i in range(5)]
    out = cutoff.passed([TextDelta(0, "t0t1t2t3t4", entries)])
    assert out == [TextDelta(0, "t0t1t2", entries[:3]), Finish(0, "length")]
    assert cutoff.done and cutoff.passed([TextDelta(0, "more")]) == []


async def test_a_node_that_ends_every_choice_itself_is_read_to_its_usage(nodes: FakeNodes) -> None:
    finishes = [chunk(finish="length", index=0), chunk(finish="length", index=1)]
    body = sse(chunk("a", index=0), chunk("b", index=1), *finishes, usage_chunk(9, 2))
    nodes.on("a", answer(lambda: event_stream(body)))
    events = await drain(nodes.backend("a").chat(chat(stream=True, max_tokens=1, n=2), Ticket("rid")))
    assert events[-1] == Usage(9, 2, 0)  # the node's own, not an estimate
