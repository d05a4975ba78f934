"""Responses requests → chat requests: items, tools, formats, and the 400s that name the right field."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tokenrelay.errors import APIError, InvalidRequest
from tokenrelay.openai.responses import translate
from tokenrelay.openai.responses.serving import parse
from tokenrelay.protocol.chat import AssistantMessage, ToolMessage


def request(**fields: Any) -> bytes:
    return json.dumps({"model": "m", **fields}).encode()


def chat_of(raw: bytes, context: list[dict[str, Any]] | None = None) -> Any:
    body = parse(raw)
    return translate.chat_request(body, translate.Conversation(context or [], translate.input_items(body)))


def error_of(raw: bytes, context: list[dict[str, Any]] | None = None) -> APIError:
    with pytest.raises(APIError) as caught:
        chat_of(raw, context)
    return caught.value


def test_a_string_input_is_one_user_turn_after_the_instructions() -> None:
    chat = chat_of(request(input="Hi", instructions="Be brief.", max_output_tokens=9, temperature=0, user="u"))
    assert [(m.role, m.text()) for m in chat.messages] == [("system", "Be brief."), ("user", "Hi")]
    assert (chat.max_completion_tokens, chat.temperature, chat.user, chat.stream) == (9, 0, "u", False)


def test_items_of_every_role_with_and_without_type_keep_their_order_and_text() -> None:
    items = [
        {"role": "developer", "content": "Rules."},
        {
            "type": "message",
            "role": "user",
            "content": [{"type": "input_text", "text": "A"}, {"type": "input_text", "text": "B"}],
        },
        {"role": "assistant", "content": [{"type": "output_text", "text": "C", "annotations": [], "logprobs": []}]},
        {"role": "system", "content": "S"},
    ]
    chat = chat_of(request(input=items))
    assert [(m.role, m.text()) for m in chat.messages] == [
        ("developer", "Rules."),
        ("user", "AB"),
        ("assistant", "C"),
        ("system", "S"),
    ]


def test_stored_items_get_ids_and_parts() -> None:
    body = parse(request(input=[{"role": "user", "content": "x"}, {"role": "assistant", "content": "y"}]))
    items = translate.input_items(body)
    assert [item["id"][:4] for item in items] == ["msg_", "msg_"] and items[0]["id"] != items[1]["id"]
    assert items[0]["content"] == [{"type": "input_text", "text": "x"}]
    assert items[1]["content"] == [{"type": "output_text", "text": "y"}]


def test_a_function_call_round_trip_becomes_tool_calls_and_a_tool_message() -> None:
    tool = {"type": "function", "name": "get_weather", "parameters": {"type": "object"}, "strict": True}
    items = [
        {"role": "user", "content": "Weather?"},
        {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "call_1", "output": "sunny"},
    ]
    chat = chat_of(request(input=items, tools=[tool], tool_choice={"type": "function", "name": "get_weather"}))
    assistant, answer = chat.messages[1], chat.messages[2]
    assert isinstance(assistant, AssistantMessage) and assistant.tool_calls is not None
    assert (assistant.tool_calls[0].id, assistant.tool_calls[0].function.name) == ("call_1", "get_weather")
    assert isinstance(answer, ToolMessage) and (answer.tool_call_id, answer.text()) == ("call_1", "sunny")
    assert chat.tools is not None and chat.tools[0].function.strict is True
    assert chat.tool_choice is not None and chat.tool_choice.function.name == "get_weather"


def test_an_answer_without_its_call_names_the_input_item() -> None:
    items = [{"role": "user", "content": "x"}, {"type": "function_call_output", "call_id": "nope", "output": "1"}]
    error = error_of(request(input=items))
    assert error.status == 400 and error.param == "input.1.call_id"


def test_text_formats_become_response_formats() -> None:
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    fmt = {"type": "json_schema", "name": "thing", "schema": schema, "strict": True}
    chat = chat_of(request(input="x", text={"format": fmt}))
    assert chat.response_format.type == "json_schema" and chat.response_format.json_schema.schema_ == schema
    assert chat_of(request(input="x", text={"format": {"type": "json_object"}})).response_format.type == "json_object"
    assert chat_of(request(input="x", text={"format": {"type": "text"}})).response_format is None


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"background": True}, "background"),
        ({"conversation": "conv_1"}, "conversation"),
        ({"tool_choice": {"type": "web_search_preview"}}, "tool_choice"),
        ({"tool_choice": "required"}, "tool_choice"),
        ({"input": [{"role": "user", "content": "x", "colour": "red"}]}, "input.0.colour"),
        ({"input": [{"role": "user", "content": [{"type": "input_text", "txt": "x"}]}]}, "input.0.content.0.txt"),
        ({"input": [{"role": "robot", "content": "x"}]}, "input.0.role"),
        ({"text": {"format": {"type": "json_schema", "schema": {}}}}, "text.format.name"),
    ],
)
def test_what_cannot_be_served_is_a_400_naming_it(fields: dict[str, Any], param: str) -> None:
    with pytest.raises(InvalidRequest) as caught:
        parse(request(**{"input": "x", **fields}))
    assert (caught.value.status, caught.value.param) == (400, param)


@pytest.mark.parametrize(
    ("fields", "named"),
    [
        ({"tools": [{"type": "web_search"}]}, ["tools.0"]),
        ({"tools": [{"type": "function", "name": "f"}, {"type": "mcp", "server_label": "x"}]}, ["tools.1"]),
        ({"reasoning": {"effort": "low"}}, ["reasoning"]),
        ({"include": ["reasoning.encrypted_content"], "prompt_cache_key": "k"}, ["include"]),
        ({"client_metadata": {"a": "b"}, "colour": "red"}, ["client_metadata", "colour"]),
        ({"text": {"verbosity": "low"}}, ["text.verbosity"]),
    ],
)
def test_hints_and_tools_run_elsewhere_are_accepted_and_named(fields: dict[str, Any], named: list[str]) -> None:
    raw = request(**{"input": "x", **fields})
    assert parse(raw).ignored() == named
    assert all(tool.function.name == "f" for tool in chat_of(raw).tools or [])


def test_a_namespaces_functions_are_shown_and_a_call_names_its_namespace() -> None:
    inner = {"type": "function", "name": "close_agent", "parameters": {"type": "object", "properties": {}}}
    spawn = {"type": "function", "name": "spawn", "parameters": {"type": "object", "properties": {}}}
    namespace = {"type": "namespace", "name": "multi_agent", "description": "Agents.", "tools": [inner, spawn]}
    clash = {"type": "function", "name": "spawn", "parameters": {"type": "object", "properties": {}}}
    call = {"type": "function_call", "call_id": "c1", "name": "spawn", "namespace": "multi_agent", "arguments": "{}"}
    answer = {"type": "function_call_output", "call_id": "c1", "output": "ok"}
    raw = request(input=[{"role": "user", "content": "x"}, call, answer], tools=[namespace, clash])
    body, chat = parse(raw), chat_of(raw)
    assert [tool.function.name for tool in chat.tools or []] == ["close_agent", "multi_agent__spawn", "spawn"]
    assert chat.messages[1].tool_calls[0].function.name == "multi_agent__spawn"
    assert body.called("multi_agent__spawn") == ("spawn", "multi_agent") and body.called("spawn") == ("spawn", None)


def test_files_cannot_be_read_without_a_files_api() -> None:
    part = {"type": "input_image", "file_id": "file-1"}
    error = error_of(request(input=[{"role": "user", "content": [part]}]))
    assert error.param == "input.0.content.0" and error.code == "unsupported_content"


def test_images_reach_the_chat_request_as_image_parts() -> None:
    part = {"type": "input_image", "image_url": "data:image/png;base64,AAAA", "detail": "low"}
    chat = chat_of(request(input=[{"role": "user", "content": [{"type": "input_text", "text": "?"}, part]}]))
    assert chat.messages[0].media_parts() == ["image_url"]


def test_a_chat_error_is_put_back_on_the_item_it_came_from() -> None:
    body = parse(request(input=[{"role": "user", "content": "a"}, {"role": "user", "content": "b"}], instructions="i"))
    context = [{"id": "msg_0", "type": "message", "role": "user", "status": "completed", "content": "c"}]
    conversation = translate.Conversation(context, translate.input_items(body))
    translate.chat_request(body, conversation)
    moved = translate.relocated(
        InvalidRequest("messages.3.content: no image_url here", param="messages.3.content"), conversation
    )
    assert moved.param == "input.1.content" and moved.message == "input.1.content: no input_image here"
    assert translate.relocated(InvalidRequest("x", param="messages.1"), conversation).param == "previous_response_id"
    assert translate.relocated(InvalidRequest("x", param="messages.0"), conversation).param == "instructions"
    too_long = translate.relocated(InvalidRequest("Lower max_tokens.", param="max_tokens"), conversation)
    assert (too_long.param, too_long.message) == ("max_output_tokens", "Lower max_output_tokens.")
    assert translate.relocated(InvalidRequest("x", param="messages"), conversation).param == "input"
    assert translate.relocated(InvalidRequest("x", param="seed"), conversation).param == "seed"


def test_dropping_the_oldest_items_keeps_calls_with_their_answers() -> None:
    items = [
        {"role": "user", "content": "q1"},
        {"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c", "output": "r"},
        {"role": "user", "content": "q2"},
    ]
    body = parse(request(input=items))
    conversation = translate.Conversation([], translate.input_items(body))
    assert conversation.drop_oldest() and [i["type"] for i in conversation.kept][:1] == ["function_call"]
    assert conversation.drop_oldest() and [i["type"] for i in conversation.kept] == ["message"]  # the orphan went too
    assert not conversation.drop_oldest()
    chat = translate.chat_request(body, conversation)
    assert [m.text() for m in chat.messages] == ["q2"]


def test_a_custom_tool_is_shown_as_a_function_of_one_string_its_grammar_in_the_description() -> None:
    lark = {"type": "grammar", "syntax": "lark", "definition": "start: /[a-z]+/"}
    patch = {"type": "custom", "name": "apply_patch", "description": "Edit files.", "format": lark}
    call = {"type": "custom_tool_call", "call_id": "c1", "name": "apply_patch", "input": "*** Begin Patch"}
    answer = {"type": "custom_tool_call_output", "call_id": "c1", "output": "Done."}
    choice = {"type": "custom", "name": "apply_patch"}
    raw = request(input=[{"role": "user", "content": "x"}, call, answer], tools=[patch], tool_choice=choice)
    body, chat = parse(raw), chat_of(raw)
    [tool] = chat.tools or []
    assert tool.function.name == "apply_patch" and (tool.function.parameters or {})["required"] == ["input"]
    assert "start: /[a-z]+/" in (tool.function.description or "")
    assert body.ignored() == ["tools.0.format"]  # a node is shown it, nothing enforces it there
    assert body.ignored(follows_lark=True) == [] and tool.function.lark == "start: /[a-z]+/"
    relayed = chat.model_dump(mode="json")["tools"][0]["function"]  # the engine's grammar is not sent to nodes
    assert set(relayed) == {"name", "description", "parameters", "strict"}
    sent = chat.messages[1].tool_calls[0].function  # type: ignore[union-attr]
    assert (sent.name, json.loads(sent.arguments)) == ("apply_patch", {"input": "*** Begin Patch"})
    assert isinstance(chat.messages[2], ToolMessage) and chat.messages[2].text() == "Done."
    orphan = {"type": "custom_tool_call_output", "call_id": "c9", "output": "?"}
    assert error_of(request(input=[{"role": "user", "content": "x"}, orphan], tools=[patch])).param == "input.1.call_id"
