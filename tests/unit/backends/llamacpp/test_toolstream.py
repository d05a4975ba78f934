"""Reading generated text for tool calls: the same calls however the text is split into deltas."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

import pytest

from tokenrelay.backends.base import Event, Finish, TextDelta, TokenLogprob, ToolCallDelta, Usage
from tokenrelay.backends.llamacpp.structured.toolformat import call_text, text_call
from tokenrelay.backends.llamacpp.structured.toolspec import ToolSpec
from tokenrelay.backends.llamacpp.structured.toolstream import ToolCallParser, tool_events
from tokenrelay.protocol.chat import FunctionDef

SPEC = ToolSpec((FunctionDef(name="f"), FunctionDef(name="g_2")), "auto", parallel=True)
TRICKY = {"text": 'a "}" and a ] in a string\\', "nested": {"list": [1, [2, {}]], "empty": ""}}


def run(parser: ToolCallParser, pieces: list[str], reason: str = "stop") -> list[Event]:
    events: list[Event] = []
    for piece in pieces:
        events.extend(parser.feed(piece))
    return events + parser.finish(reason)


def summary(events: list[Event]) -> tuple[str, list[tuple[str | None, str]], str]:
    """(answer text, [(name, joined arguments)], finish reason)."""
    text = "".join(e.text for e in events if isinstance(e, TextDelta))
    calls: dict[int, list] = {}
    for e in events:
        if isinstance(e, ToolCallDelta):
            calls.setdefault(e.call_index, [e.name, ""])[1] += e.arguments
    finish = [e for e in events if isinstance(e, Finish)]
    assert len(finish) == 1
    return text, [tuple(calls[i]) for i in sorted(calls)], finish[0].reason


OUTPUT = "Let me check. " + call_text("f", json.dumps(TRICKY, separators=(",", ":"))) + call_text("g_2", "{}")


def test_text_then_two_calls() -> None:
    text, calls, reason = summary(run(ToolCallParser(0, SPEC), [OUTPUT]))
    assert text == "Let me check. "
    assert calls == [("f", json.dumps(TRICKY, separators=(",", ":"))), ("g_2", "{}")]
    assert json.loads(calls[0][1]) == TRICKY
    assert reason == "tool_calls"


@pytest.mark.parametrize("size", [1, 2, 3, 5, 7, 11])
def test_any_split_gives_the_same_result(size: int) -> None:
    pieces = [OUTPUT[i : i + size] for i in range(0, len(OUTPUT), size)]
    assert summary(run(ToolCallParser(0, SPEC), pieces)) == summary(run(ToolCallParser(0, SPEC), [OUTPUT]))


def test_first_delta_carries_id_and_name_then_only_argument_fragments() -> None:
    events = run(ToolCallParser(2, SPEC), [OUTPUT[i : i + 4] for i in range(0, len(OUTPUT), 4)])
    calls = [e for e in events if isinstance(e, ToolCallDelta)]
    firsts = [e for e in calls if e.id is not None]
    assert [e.name for e in firsts] == ["f", "g_2"] and all(e.arguments == "" for e in firsts)
    assert firsts[0].id != firsts[1].id and firsts[0].id.startswith("call_")
    assert all(e.name is None for e in calls if e.id is None)
    assert len([e for e in calls if e.call_index == 0]) > 5  # streamed as generated, not at the end
    assert all(e.index == 2 for e in events)


PATCH = '*** Begin Patch\n+print("a \\ b")\n*** End Patch'
TEXT_OUTPUT = text_call("apply_patch", PATCH) + call_text("f", "{}")


@pytest.mark.parametrize("size", [1, 3, 8, len(TEXT_OUTPUT)])
def test_a_text_call_comes_out_as_its_text_in_json_arguments(size: int) -> None:
    pieces = [TEXT_OUTPUT[i : i + size] for i in range(0, len(TEXT_OUTPUT), size)]
    text, calls, reason = summary(run(ToolCallParser(0, SPEC), pieces))
    assert text == "" and reason == "tool_calls"
    assert [name for name, _ in calls] == ["apply_patch", "f"]
    assert json.loads(calls[0][1]) == {"input": PATCH} and calls[1][1] == "{}"


def test_text_that_only_looks_like_a_marker_start_is_released() -> None:
    events = run(ToolCallParser(0, SPEC), ["a <tool", "_c", "at> b <"])
    assert summary(events) == ("a <tool_cat> b <", [], "stop")
    # ... but not before it is known not to be a marker.
    parser = ToolCallParser(0, SPEC)
    assert [e.text for e in parser.feed("x <tool_ca") if isinstance(e, TextDelta)] == ["x "]


def test_cut_inside_a_call_keeps_the_cut_reason() -> None:
    cut = OUTPUT[: OUTPUT.index('"nested"')]
    _, calls, reason = summary(run(ToolCallParser(0, SPEC), [cut], "length"))
    assert reason == "length" and calls[0][0] == "f"
    _, _, reason = summary(run(ToolCallParser(0, SPEC), [cut], "stop"))
    assert reason == "stop"  # a stop string cut the call: not reported as a finished call


def test_legacy_functions_finish_with_function_call() -> None:
    legacy = ToolSpec((FunctionDef(name="f"),), "f", parallel=False, legacy=True)
    assert summary(run(ToolCallParser(0, legacy), [call_text("f", "{}")]))[2] == "function_call"


def test_plain_answer_keeps_its_logprobs_and_reason() -> None:
    entry = TokenLogprob("hi", -0.5, list(b"hi"), [])
    parser = ToolCallParser(0, SPEC)
    events = parser.feed("hi", [entry]) + parser.finish("length")
    assert events == [TextDelta(0, "hi", [entry]), Finish(0, "length")]


def test_tool_events_reads_each_choice_separately_and_passes_other_events() -> None:
    async def source() -> AsyncIterator[Event]:
        for i, piece in enumerate([OUTPUT[:20], OUTPUT[20:]]):
            yield TextDelta(0, piece)
            yield TextDelta(1, ["plain ", "answer"][i])
        yield Finish(1, "stop")
        yield Finish(0, "stop")
        yield Usage(prompt_tokens=3, completion_tokens=4)

    async def gather() -> list[Event]:
        return [event async for event in tool_events(source(), SPEC)]

    events = asyncio.run(gather())
    assert summary([e for e in events if getattr(e, "index", 0) == 0 and not isinstance(e, Usage)])[2] == "tool_calls"
    assert summary([e for e in events if getattr(e, "index", None) == 1]) == ("plain answer", [], "stop")
    assert isinstance(events[-1], Usage)
