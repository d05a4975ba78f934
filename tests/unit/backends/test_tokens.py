"""Token counts made without the model: the one rule for events, and the counters of text and prompts."""

from __future__ import annotations

import pytest

from tokenrelay.backends.base import (
    DeltaFields,
    Event,
    Finish,
    TextDelta,
    TextRun,
    TokenLogprob,
    ToolCallDelta,
    Usage,
)
from tokenrelay.backends.tokens import ApproxCounter, ByteBound, event_tokens, text_tokens


def logprob(token: str) -> TokenLogprob:
    return TokenLogprob(token=token, logprob=-0.5, bytes=None, top=[])


@pytest.mark.parametrize(
    ("event", "tokens"),
    [
        (TextDelta(0, "Hello"), 1),
        (TextDelta(0, ""), 0),
        (TextDelta(0, "Hello", [logprob("Hel"), logprob("lo")]), 2),
        (TextRun(0, ["a", "b", "c"]), 3),
        (ToolCallDelta(0, 0, id="call_1", name="get_weather"), 1),
        (ToolCallDelta(0, 0, arguments='{"city"'), 1),
        (ToolCallDelta(0, 0, id="call_1"), 0),
        (DeltaFields(0, {"reasoning_content": "Let me think"}), 1),
        (Finish(0, "stop"), 0),
        (Usage(prompt_tokens=3, completion_tokens=5), 0),
    ],
)
def test_an_event_stands_for_its_logprobs_or_one_token_per_piece_of_output(event: Event, tokens: int) -> None:
    assert event_tokens(event) == tokens


def test_the_estimate_is_about_four_bytes_a_token_and_the_bound_one_a_byte() -> None:
    assert ApproxCounter().count("abcdefgh") == 2
    assert ApproxCounter().count("é") == 1  # two bytes, rounded up
    assert ByteBound().count("é") == 2
    assert ByteBound(specials=2).count("abc") == 5


def test_token_ids_count_exactly_whatever_the_counter() -> None:
    assert text_tokens([5, 6, 7], ByteBound(specials=2)) == 3
    assert text_tokens("abcd", ByteBound(specials=2)) == 6
    assert text_tokens("abcd", ApproxCounter()) == 1
