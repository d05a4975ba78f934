"""Tool calling on the embedded engine with the default model, through the official client."""

from __future__ import annotations

import concurrent.futures
import json
from typing import Any

import jsonschema
import pytest
from helpers import MODEL, chunks, sse_events, user
from openai import BadRequestError, OpenAI

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "maxLength": 24}, "unit": {"enum": ["celsius", "fahrenheit"]}},
            "required": ["city", "unit"],
        },
    },
}
ORDER = {
    "type": "function",
    "function": {
        "name": "place_order",
        "description": "Order items from the shop.",
        "parameters": {
            "type": "object",
            "properties": {
                "items": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "properties": {
                            "sku": {"type": "string", "pattern": "^[A-Z]{2}[0-9]{3}$"},
                            "quantity": {"type": "integer", "minimum": 1, "maximum": 9},
                        },
                        "required": ["sku", "quantity"],
                    },
                    "minItems": 1,
                    "maxItems": 3,
                },
                "express": {"type": "boolean"},
            },
            "required": ["items", "express"],
        },
    },
}
CLOCK = {"type": "function", "function": {"name": "get_time", "description": "The current time."}}  # no parameters
TOOLS = [WEATHER, ORDER, CLOCK]
PARAMETERS = {t["function"]["name"]: t["function"].get("parameters", {"type": "object"}) for t in TOOLS}
QUESTION = user("What is the weather in Paris? Also order two apples.")


def named(name: str) -> dict[str, Any]:
    return {"type": "function", "function": {"name": name}}


def create(client: OpenAI, **kw: Any):
    body = {"model": MODEL, "messages": QUESTION, "max_tokens": 96, "tools": TOOLS} | kw
    return client.chat.completions.create(**body)


def assert_valid_calls(message: Any, allowed: set[str]) -> None:
    assert message.tool_calls, message
    for call in message.tool_calls:
        assert call.type == "function" and call.id.startswith("call_")
        assert call.function.name in allowed
        jsonschema.validate(json.loads(call.function.arguments), PARAMETERS[call.function.name])


@pytest.mark.parametrize("name", ["get_weather", "place_order", "get_time"])
def test_named_choice_always_calls_that_function_with_valid_arguments(client: OpenAI, name: str) -> None:
    def one(seed: int):
        return create(client, tool_choice=named(name), temperature=1.0, seed=seed)

    with concurrent.futures.ThreadPoolExecutor(max_workers=4) as pool:
        replies = list(pool.map(one, range(4)))
    for reply in replies:
        choice = reply.choices[0]
        assert choice.finish_reason == "tool_calls"
        assert choice.message.content is None
        assert len(choice.message.tool_calls) == 1  # a named choice is one call
        assert_valid_calls(choice.message, {name})
    assert len({c.id for r in replies for c in r.choices[0].message.tool_calls}) == 4


@pytest.mark.parametrize("parallel", [False, True])
def test_required_choice_always_calls_with_valid_arguments(client: OpenAI, parallel: bool) -> None:
    def one(seed: int):
        return create(client, tool_choice="required", parallel_tool_calls=parallel, temperature=1.0, seed=seed)

    with concurrent.futures.ThreadPoolExecutor(max_workers=4) as pool:
        replies = list(pool.map(one, range(4)))
    for reply in replies:
        choice = reply.choices[0]
        assert choice.finish_reason == "tool_calls", choice.message
        assert_valid_calls(choice.message, set(PARAMETERS))
        if not parallel:
            assert len(choice.message.tool_calls) == 1


def test_streamed_calls_follow_the_openai_delta_shape(server) -> None:
    body = {
        "model": MODEL,
        "messages": QUESTION,
        "max_tokens": 96,
        "temperature": 0,
        "tools": TOOLS,
        "tool_choice": named("place_order"),
        "stream": True,
    }
    with server.http() as http:
        events = chunks(sse_events(http, "/v1/chat/completions", body))
    deltas = [c["choices"][0]["delta"] for c in events if c["choices"]]
    calls = [d["tool_calls"][0] for d in deltas if d.get("tool_calls")]
    first, rest = calls[0], calls[1:]
    assert first["index"] == 0 and first["type"] == "function" and first["id"].startswith("call_")
    assert first["function"]["name"] == "place_order"
    assert len(rest) > 3  # arguments arrive in fragments as they are generated
    assert all(set(c) == {"index", "function"} and set(c["function"]) == {"arguments"} for c in rest)
    arguments = "".join(c["function"]["arguments"] for c in calls)
    jsonschema.validate(json.loads(arguments), PARAMETERS["place_order"])
    assert not any(d.get("content") for d in deltas)
    assert [c["choices"][0]["finish_reason"] for c in events if c["choices"]][-1] == "tool_calls"


def test_streamed_required_calls_are_valid(client: OpenAI) -> None:
    stream = create(client, tool_choice="required", temperature=0.7, seed=3, stream=True)
    calls: dict[int, dict[str, str]] = {}
    finish = None
    for chunk in stream:
        choice = chunk.choices[0]
        finish = choice.finish_reason or finish
        for delta in choice.delta.tool_calls or []:
            call = calls.setdefault(delta.index, {"name": "", "arguments": ""})
            call["name"] += delta.function.name or ""
            call["arguments"] += delta.function.arguments or ""
    assert finish == "tool_calls" and calls
    for call in calls.values():
        jsonschema.validate(json.loads(call["arguments"]), PARAMETERS[call["name"]])


def test_none_never_calls_and_leaves_tools_out_of_the_prompt(client: OpenAI) -> None:
    reply = create(client, tool_choice="none", max_tokens=24, temperature=0)
    without_tools = client.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=24, temperature=0)
    assert reply.choices[0].message.tool_calls is None
    assert reply.choices[0].finish_reason in ("stop", "length")
    assert reply.usage.prompt_tokens == without_tools.usage.prompt_tokens
    assert reply.choices[0].message.content == without_tools.choices[0].message.content


FEW_SHOT = [
    {"role": "user", "content": "What is the weather in Oslo?"},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "call_1",
                "type": "function",
                "function": {"name": "get_weather", "arguments": '{"city":"Oslo","unit":"celsius"}'},
            }
        ],
    },
    {"role": "tool", "tool_call_id": "call_1", "content": "cloudy, 4 degrees"},
    {"role": "assistant", "content": "It is cloudy in Oslo, 4 degrees."},
]


def test_auto_turns_a_call_the_model_makes_into_tool_calls(client: OpenAI) -> None:
    messages = [*FEW_SHOT, {"role": "user", "content": "What is the weather in Rome?"}]
    reply = create(client, messages=messages, tool_choice="auto", temperature=0)
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content is None
    assert_valid_calls(choice.message, set(PARAMETERS))


def test_auto_without_a_call_is_a_plain_answer(client: OpenAI) -> None:
    reply = create(client, messages=user("Say hello."), max_tokens=12, temperature=0)
    choice = reply.choices[0]
    assert choice.message.tool_calls is None and choice.message.content
    assert choice.finish_reason in ("stop", "length")


def test_two_turn_tool_conversation(client: OpenAI) -> None:
    first = create(client, tool_choice=named("get_weather"), temperature=0)
    call = first.choices[0].message.tool_calls[0]
    history = [
        *QUESTION,
        first.choices[0].message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": "sunny, 21 degrees"},
    ]
    second = create(client, messages=history, tool_choice="none", max_tokens=16, temperature=0)
    assert second.choices[0].message.content and second.choices[0].message.tool_calls is None
    # The earlier call is part of the next prompt (written in the call syntax), and so is the result.
    assert second.usage.prompt_tokens > first.usage.completion_tokens + 10
    bare = create(client, messages=[*QUESTION, {"role": "assistant", "content": ""}], tool_choice="none", max_tokens=1)
    assert second.usage.prompt_tokens >= bare.usage.prompt_tokens + first.usage.completion_tokens
    # And the conversation can go on calling tools.
    third = create(client, messages=history, tool_choice="required", temperature=0)
    assert_valid_calls(third.choices[0].message, set(PARAMETERS))


def test_n_choices_each_get_valid_calls(client: OpenAI) -> None:
    reply = create(client, tool_choice=named("get_weather"), n=3, temperature=1.0, seed=9)
    assert len(reply.choices) == 3
    for choice in reply.choices:
        assert choice.finish_reason == "tool_calls"
        assert_valid_calls(choice.message, {"get_weather"})


def test_legacy_functions_answer_with_function_call(client: OpenAI, server) -> None:
    functions = [WEATHER["function"], ORDER["function"]]
    reply = client.chat.completions.create(
        model=MODEL,
        messages=QUESTION,
        max_tokens=64,
        temperature=0,
        functions=functions,
        function_call={"name": "get_weather"},
    )
    choice = reply.choices[0]
    assert choice.finish_reason == "function_call" and choice.message.tool_calls is None
    assert choice.message.function_call.name == "get_weather"
    jsonschema.validate(json.loads(choice.message.function_call.arguments), PARAMETERS["get_weather"])
    body = {
        "model": MODEL,
        "messages": QUESTION,
        "max_tokens": 64,
        "temperature": 0,
        "functions": functions,
        "function_call": {"name": "get_weather"},
        "stream": True,
    }
    with server.http() as http:
        events = chunks(sse_events(http, "/v1/chat/completions", body))
    parts = [
        c["choices"][0]["delta"]["function_call"]
        for c in events
        if c["choices"] and "function_call" in c["choices"][0]["delta"]
    ]
    assert parts[0]["name"] == "get_weather"
    jsonschema.validate(json.loads("".join(p["arguments"] for p in parts)), PARAMETERS["get_weather"])
    assert [c["choices"][0]["finish_reason"] for c in events if c["choices"]][-1] == "function_call"


def test_cut_by_max_tokens_says_length(client: OpenAI) -> None:
    reply = create(client, tool_choice=named("place_order"), max_tokens=8, temperature=0)
    assert reply.choices[0].finish_reason == "length"


BAD_REQUESTS = [
    ({"tool_choice": named("get_weather")}, "tool_choice", "no `tools`"),
    ({"tools": TOOLS, "tool_choice": named("launch_rocket")}, "tool_choice", "launch_rocket"),
    ({"tool_choice": "required"}, "tool_choice", "required"),
    ({"functions": [WEATHER["function"]], "function_call": {"name": "nope"}}, "function_call", "nope"),
    ({"tools": []}, "tools", ""),
    ({"tools": [WEATHER], "functions": [ORDER["function"]]}, "functions", "not both"),
    ({"tools": [WEATHER, WEATHER]}, "tools.1.function", "unique"),
    (
        {"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "objekt"}}}]},
        "tools.0.function.parameters",
        "not a valid JSON Schema",
    ),
]


@pytest.mark.parametrize(("change", "param", "named_in_message"), BAD_REQUESTS)
def test_bad_tool_requests_are_400(client: OpenAI, change: dict[str, Any], param: str, named_in_message: str) -> None:
    with pytest.raises(BadRequestError) as info:
        client.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=4, **change)
    assert info.value.body["param"] == param
    assert named_in_message in info.value.message


def test_a_tool_schema_keyword_the_decoder_cannot_enforce_is_no_refusal(client: OpenAI) -> None:
    """Agents' tool schemas use keywords such as `uniqueItems` or `propertyNames`: the call follows the rest."""
    tags = {"type": "array", "items": {"type": "string", "maxLength": 8}, "maxItems": 3, "uniqueItems": True}
    tool = {
        "type": "function",
        "function": {
            "name": "tag",
            "parameters": {"type": "object", "properties": {"tags": tags}, "required": ["tags"]},
        },
    }
    reply = create(client, messages=user("Tag this: red apple."), tools=[tool], tool_choice="required", temperature=0)
    [call] = reply.choices[0].message.tool_calls[:1]
    arguments = json.loads(call.function.arguments)
    assert isinstance(arguments["tags"], list) and len(arguments["tags"]) <= 3


def test_auto_with_a_response_format_answers_in_that_format_or_calls(client: OpenAI) -> None:
    schema = {
        "type": "object",
        "properties": {"greeting": {"type": "string", "maxLength": 20}},
        "required": ["greeting"],
    }
    reply = create(
        client,
        messages=user("Say hello."),
        temperature=0,
        response_format={"type": "json_schema", "json_schema": {"name": "g", "schema": schema}},
    )
    message = reply.choices[0].message
    if message.tool_calls:
        assert_valid_calls(message, set(PARAMETERS))
    else:
        assert reply.choices[0].finish_reason == "stop"
        jsonschema.validate(json.loads(message.content), schema)
