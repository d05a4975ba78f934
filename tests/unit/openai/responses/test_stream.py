"""A backend's events → the Responses stream: OpenAI's order, numbering, and the end events."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest

from tokenrelay.api.collect import Collected
from tokenrelay.backends.base import (
    DeltaFields,
    Event,
    Events,
    Finish,
    Served,
    TextDelta,
    TextRun,
    ToolCallDelta,
    Usage,
)
from tokenrelay.errors import APIError, InvalidRequest
from tokenrelay.openai.responses.render import ResponseHead, collected_response
from tokenrelay.openai.responses.serving import parse, stream_payloads
from tokenrelay.openai.responses.stream import ResponseStream

TEXT_ORDER = [
    "response.created",
    "response.in_progress",
    "response.output_item.added",
    "response.content_part.added",
    "response.output_text.delta",
    "response.output_text.delta",
    "response.output_text.delta",
    "response.output_text.done",
    "response.content_part.done",
    "response.output_item.done",
    "response.completed",
]


def head(**fields: Any) -> ResponseHead:
    return ResponseHead("resp_1", 1, parse(json.dumps({"model": "m", "input": "x", **fields}).encode()))


async def feed(
    events: list[Event], fail: APIError | None = None, **fields: Any
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    saved: list[dict[str, Any]] = []

    async def source() -> AsyncIterator[Events]:
        for event in events:
            yield [event]
        if fail is not None:
            raise fail

    async def save(response: dict[str, Any]) -> None:
        saved.append(response)

    payloads = [p async for chunk in stream_payloads(ResponseStream(head(**fields)), source(), save) for p in chunk]
    return payloads, saved


def run(events: list[Event], fail: APIError | None = None) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    return asyncio.run(feed(events, fail))


def test_a_text_answer_streams_in_openai_order_with_increasing_numbers() -> None:
    events = [Served("n", "upstream"), TextDelta(0, "Hel"), TextRun(0, ["lo", "!"]), Finish(0, "stop"), Usage(5, 3)]
    payloads, saved = run(events)
    assert [p["type"] for p in payloads] == TEXT_ORDER
    assert [p["sequence_number"] for p in payloads] == list(range(len(payloads)))
    done = payloads[-1]["response"]
    assert done["status"] == "completed" and done["output"][0]["content"][0]["text"] == "Hello!"
    assert payloads[7]["text"] == "Hello!" and payloads[-2]["item"] == done["output"][0]
    assert done["usage"]["total_tokens"] == 8 and saved == [done]
    assert payloads[0]["response"]["status"] == "in_progress"


def test_tool_calls_stream_their_arguments_between_their_items_added_and_done() -> None:
    events = [
        TextDelta(0, "Let me see."),
        ToolCallDelta(0, 0, id="call_a", name="f", arguments='{"x":'),
        ToolCallDelta(0, 0, arguments="1}"),
        ToolCallDelta(0, 1, id="call_b", name="g", arguments="{}"),
        Finish(0, "tool_calls"),
        Usage(4, 9),
    ]
    payloads, _ = run(events)
    kinds = [p["type"] for p in payloads]
    assert kinds[kinds.index("response.output_item.done") + 1 :] == [
        "response.output_item.added",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.output_item.added",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.completed",
    ]
    output = payloads[-1]["response"]["output"]
    assert [item["type"] for item in output] == ["message", "function_call", "function_call"]
    assert (output[1]["call_id"], output[1]["arguments"], output[2]["name"]) == ("call_a", '{"x":1}', "g")
    assert [p["output_index"] for p in payloads if p["type"] == "response.output_item.added"] == [0, 1, 2]


def test_a_length_stop_is_incomplete() -> None:
    payloads, _ = run([TextDelta(0, "a"), Finish(0, "length"), Usage(1, 1)])
    last = payloads[-1]
    assert last["type"] == "response.incomplete"
    assert last["response"]["incomplete_details"] == {"reason": "max_output_tokens"}


def test_a_failure_after_the_first_byte_is_an_error_then_response_failed() -> None:
    payloads, saved = run([TextDelta(0, "a")], fail=APIError("node broke", code="upstream_error"))
    assert [p["type"] for p in payloads][-3:] == ["response.output_item.done", "error", "response.failed"]
    assert payloads[-2]["code"] == "upstream_error" and payloads[-1]["response"]["error"]["message"] == "node broke"
    assert saved[0]["status"] == "failed"


def test_a_failure_before_anything_went_out_stays_an_http_error() -> None:
    with pytest.raises(InvalidRequest):
        run([Served("n", "upstream")], fail=InvalidRequest("too long", code="context_length_exceeded"))


def test_the_collected_answer_is_what_the_stream_assembles() -> None:
    events: list[Event] = [
        TextDelta(0, "Hi"),
        ToolCallDelta(0, 0, id="c", name="f", arguments="{}"),
        Finish(0, "tool_calls"),
    ]
    collected = Collected()
    for event in [*events, Usage(2, 2)]:
        collected.add(event)
    whole = collected_response(head(), collected)
    streamed = run([*events, Usage(2, 2)])[0][-1]["response"]
    strip = [{k: v for k, v in item.items() if k != "id"} for item in whole["output"]]
    assert strip == [{k: v for k, v in item.items() if k != "id"} for item in streamed["output"]]
    assert whole["usage"] == streamed["usage"] and whole["status"] == streamed["status"] == "completed"


def test_a_nodes_reasoning_is_a_reasoning_item_before_the_answer() -> None:
    events = [
        DeltaFields(0, {"reasoning_content": "Think"}),
        DeltaFields(0, {"reasoning_content": "ing."}),
        TextDelta(0, "Hi"),
        Finish(0, "stop"),
        Usage(5, 3),
    ]
    payloads, [saved] = run(events)
    kinds = [p["type"] for p in payloads]
    assert kinds[2:6] == [
        "response.output_item.added",
        "response.reasoning_text.delta",
        "response.reasoning_text.delta",
        "response.reasoning_text.done",
    ]
    reasoning, message = saved["output"]
    assert reasoning["type"] == "reasoning" and reasoning["content"] == [
        {"type": "reasoning_text", "text": "Thinking."}
    ]
    assert message["type"] == "message" and message["content"][0]["text"] == "Hi"
    collected = Collected()
    for event in events:
        collected.add(event)
    assert collected_response(head(), collected)["output"][0]["content"] == reasoning["content"]


def test_reasoning_sent_back_in_the_input_is_kept_and_not_shown_to_the_model() -> None:
    reasoning = {"type": "reasoning", "summary": [], "content": [{"type": "reasoning_text", "text": "hm"}]}
    body = parse(json.dumps({"model": "m", "input": [{"role": "user", "content": "x"}, reasoning]}).encode())
    assert [item.type for item in body.input] == ["message", "reasoning"]  # type: ignore[union-attr]


def test_a_custom_tools_call_streams_its_text_input_whole() -> None:
    patch = {"type": "custom", "name": "apply_patch"}
    calls = [
        ToolCallDelta(0, 0, id="call_a", name="apply_patch", arguments='{"input": "line one'),
        ToolCallDelta(0, 0, arguments='\\nline two"}'),
    ]
    payloads, saved = asyncio.run(feed([*calls, Finish(0, "tool_calls"), Usage(5, 3)], tools=[patch]))
    kinds = [p["type"] for p in payloads]
    assert "response.function_call_arguments.delta" not in kinds
    done = next(p for p in payloads if p["type"] == "response.custom_tool_call_input.done")
    assert done["input"] == "line one\nline two"
    [item] = saved[0]["output"]
    assert (item["type"], item["call_id"], item["name"]) == ("custom_tool_call", "call_a", "apply_patch")
    assert item["input"] == done["input"]
    collected = Collected()
    for event in calls:
        collected.add(event)
    assert collected_response(head(tools=[patch]), collected)["output"][0]["input"] == done["input"]
