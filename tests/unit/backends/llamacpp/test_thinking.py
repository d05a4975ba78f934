"""A thinking section in generated text becomes reasoning, whichever tokens its tags are split across."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator

from tokenrelay.backends.base import DeltaFields, Event, Finish, TextDelta, TokenLogprob, Usage
from tokenrelay.backends.llamacpp.thinking import opened_by, thinking_events, thinks


def words(text: str) -> int:
    """A stand-in tokenizer: a token per word."""
    return len(text.split())


def split(pieces: list[str], opened: bool = False) -> tuple[str, str, list[Event]]:
    async def source() -> AsyncGenerator[Event, None]:
        for piece in pieces:
            yield TextDelta(0, piece)
        yield Finish(0, "stop")
        yield Usage(prompt_tokens=5, completion_tokens=len(pieces))

    async def run() -> list[Event]:
        return [event async for event in thinking_events(source(), opened, words)]

    events = asyncio.run(run())
    reasoning = "".join(e.fields["reasoning_content"] for e in events if isinstance(e, DeltaFields))
    answer = "".join(e.text for e in events if isinstance(e, TextDelta))
    return reasoning, answer, events


def test_tags_split_across_tokens_are_found() -> None:
    pieces = ["<th", "ink>", "Two plus", " two is four.</", "thi", "nk>\n\n", "It is ", "4."]
    reasoning, answer, events = split(pieces)
    assert (reasoning, answer) == ("Two plus two is four.", "It is 4.")
    assert isinstance(events[-2], Finish) and isinstance(events[-1], Usage)


def test_a_prompt_that_opened_the_section_leaves_only_its_end_to_the_model() -> None:
    assert split(["Hmm, ", "blue.", "</think>", "Blue."], opened=True)[:2] == ("Hmm, blue.", "Blue.")
    assert opened_by("<|im_start|>assistant\n<think>\n") and not opened_by("<|im_start|>assistant\n")


def test_an_answer_without_the_tag_passes_unchanged_with_its_logprobs() -> None:
    logprob = TokenLogprob("<", -0.1, None, [])

    async def source() -> AsyncGenerator[Event, None]:
        yield TextDelta(0, "<b>bold</b>", [logprob])
        yield Finish(0, "stop")

    async def run() -> list[Event]:
        return [event async for event in thinking_events(source(), False, words)]

    events = asyncio.run(run())
    assert isinstance(events[0], TextDelta) and events[0].text == "<b>bold</b>" and events[0].logprobs == [logprob]


def test_a_section_cut_short_is_all_reasoning_and_a_lone_prefix_is_text() -> None:
    assert split(["<think>", "still thinking </thi"])[:2] == ("still thinking </thi", "")
    assert split(["<thi"])[:2] == ("", "<thi")


def test_only_templates_with_a_thinking_section_are_split() -> None:
    assert thinks("{{ '<think>' }}{{ x }}{{ '</think>' }}") and not thinks("{{ messages }}")


def test_the_usage_counts_the_reasoning_tokens_of_every_choice() -> None:
    async def source() -> AsyncGenerator[Event, None]:
        yield TextDelta(0, "<think>one two three</think>Four.")
        yield TextDelta(1, "<think>five six</think>Seven eight nine.")
        yield Finish(0, "stop")
        yield Finish(1, "stop")
        yield Usage(prompt_tokens=5, completion_tokens=20)

    async def run() -> list[Event]:
        return [event async for event in thinking_events(source(), False, words)]

    usage = asyncio.run(run())[-1]
    assert isinstance(usage, Usage) and usage.reasoning_tokens == 5


def test_an_answer_without_reasoning_counts_none() -> None:
    usage = split(["Plain ", "answer."])[2][-1]
    assert isinstance(usage, Usage) and usage.reasoning_tokens == 0
