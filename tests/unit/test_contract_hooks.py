"""The contract test's schemathesis hooks take any JSON a generator builds without raising."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
from contract_hooks import MAX_TOKENS, _has_media, filter_case, map_case

PATHS = ["/v1/chat/completions", "/v1/completions", "/v1/messages", "/v1/responses", "/v1/embeddings", "/tokenize"]
# Shapes the schema allows somewhere but the hooks once assumed away: arrays and objects where a string or a
# message was expected, messages that are not objects, arrays within arrays.
ODD_BODIES: list[dict[str, Any]] = [
    {"model": "m", "messages": [{"role": "user", "content": [{"type": ["image_url"]}]}]},
    {"model": "m", "messages": [{"role": "user", "content": [{"type": {"image": True}}]}]},
    {"model": "m", "input": [{"type": [["input_image"]]}, [[{"type": {}}]]]},
    {"model": "m", "messages": [1, "text", None, ["nested"], [{"role": "tool"}]]},
    {"model": "m", "messages": "hi", "continue_final_message": True},
    {"model": "m", "messages": [{"role": "assistant", "tool_calls": {"id": "a"}}, {"role": "tool"}]},
    {"model": "m", "messages": [{"role": "assistant", "content": {"type": "tool_use"}}]},
    {"model": "m", "tools": 5, "functions": "f", "tool_choice": {"function": []}},
    {"model": "m", "tools": [{"function": "f"}, ["g"]], "tool_choice": {"type": "function", "function": {"name": "f"}}},
    {"model": "m", "tools": {"name": "t"}, "tool_choice": {"type": "any"}},
    {"model": "m", "prompt": [[1, [2]], "x"], "best_of": "2", "n": [1]},
    {"model": "m", "logit_bias": {"--5": 1, "²": 2, "-": 3, "7": 4}},
]


def case(path: str, body: Any) -> SimpleNamespace:
    return SimpleNamespace(meta=None, operation=SimpleNamespace(path=path), body=body, query=None)


def test_media_is_a_type_named_in_a_string() -> None:
    assert not _has_media({"type": ["image_url"]})
    assert not _has_media({"type": {"image_url": 1}})
    assert not _has_media([[{"type": ["image"]}], "image", [[]]])
    assert _has_media([{"content": [[{"type": "image"}]]}])


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("body", ODD_BODIES)
def test_hooks_take_any_shape(path: str, body: dict[str, Any]) -> None:
    assert filter_case(None, case(path, body)) in (True, False)
    assert map_case(None, case(path, body)).body is body


def test_odd_shapes_are_judged_sensibly() -> None:
    text_with_listed_type = ODD_BODIES[0]
    assert filter_case(None, case("/v1/chat/completions", text_with_listed_type))
    image = {"model": "m", "messages": [{"role": "user", "content": [{"type": "image_url"}]}]}
    assert not filter_case(None, case("/v1/chat/completions", image))
    assert filter_case(None, case("/v1/messages", {"model": "m", "messages": [1, "x"], "tools": 5}))
    unlisted = {"model": "m", "tools": [{"function": "f"}], "tool_choice": {"function": {"name": "f"}}}
    assert not filter_case(None, case("/v1/chat/completions", unlisted))
    assert filter_case(None, case("/v1/completions", {"model": "m", "prompt": "x", "best_of": "2", "n": 3}))
    assert not filter_case(None, case("/v1/completions", {"model": "m", "logit_bias": {"--5": 1, "99999": 1}}))
    assert map_case(None, case("/v1/messages", {"model": "m", "messages": "hi"})).body["max_tokens"] == MAX_TOKENS


def test_a_responses_input_of_reasoning_alone_is_kept_only_with_instructions() -> None:
    reasoning = {"type": "reasoning", "summary": []}
    message = {"role": "user", "content": "x"}
    assert not filter_case(None, case("/v1/responses", {"model": "m", "input": [reasoning]}))
    assert filter_case(None, case("/v1/responses", {"model": "m", "input": [reasoning], "instructions": "Hi."}))
    assert filter_case(None, case("/v1/responses", {"model": "m", "input": [reasoning, message]}))


def test_a_responses_tool_output_is_kept_only_after_its_call() -> None:
    ask = {"role": "user", "content": "x"}
    custom_call = {"type": "custom_tool_call", "call_id": "c1", "name": "shell", "input": "ls"}
    custom_answer = {"type": "custom_tool_call_output", "call_id": "c1", "output": "a.txt"}
    assert filter_case(None, case("/v1/responses", {"model": "m", "input": [ask, custom_call, custom_answer]}))
    assert not filter_case(None, case("/v1/responses", {"model": "m", "input": [ask, custom_answer]}))
    function_answer = {"type": "function_call_output", "call_id": "c2", "output": "?"}
    assert not filter_case(None, case("/v1/responses", {"model": "m", "input": [ask, custom_call, function_answer]}))


def test_an_invalid_upload_form_is_dropped_only_when_its_violation_cannot_reach_the_server() -> None:
    def invalid(body: dict[str, Any]) -> SimpleNamespace:
        negative = SimpleNamespace(generation=SimpleNamespace(mode=SimpleNamespace(is_positive=False)))
        return SimpleNamespace(meta=negative, operation=SimpleNamespace(path="/v1/files"), body=body, query=None)

    form = {"file": "x", "purpose": "batch"}
    assert not filter_case(None, invalid(form | {"extra": None}))  # sent as the text "null": a valid field
    assert not filter_case(None, invalid(form | {"extra": 3}))
    assert filter_case(None, invalid(form | {"purpose": "fine-tune"}))  # the server sees this one
    assert filter_case(None, invalid(form | {"extra": ["a", "b"]}))
