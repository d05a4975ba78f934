"""Messages requests → chat requests: blocks, tools, tool choices and sampling fields, and what is refused."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tokenrelay.anthropic.messages.protocol import CountTokensRequest, MessagesRequest
from tokenrelay.anthropic.messages.serving import ENDPOINT
from tokenrelay.anthropic.messages.translate import ERROR_MARK, to_chat
from tokenrelay.errors import InvalidRequest
from tokenrelay.protocol.chat import AssistantMessage, NamedToolChoice, ToolMessage, UserMessage

WEATHER = {"name": "weather", "description": "Weather in a city", "input_schema": {"type": "object"}}


def request(**fields: Any) -> MessagesRequest:
    body = {"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "Hi"}], **fields}
    return MessagesRequest.model_validate_json(json.dumps(body), strict=True)


def test_sampling_fields_carry_over() -> None:
    chat = to_chat(
        request(
            system="Be brief.",
            stop_sequences=["\n", "END"],
            temperature=0.5,
            top_p=0.9,
            top_k=40,
            metadata={"user_id": "u-1"},
        ),
        stream=True,
    )
    assert chat.messages[0].role == "system" and chat.messages[0].text() == "Be brief."
    assert (chat.max_tokens, chat.stop, chat.temperature, chat.top_p, chat.top_k) == (8, ["\n", "END"], 0.5, 0.9, 40)
    assert chat.user == "u-1" and chat.stream is True
    assert ENDPOINT == "messages"


def test_system_blocks_are_joined() -> None:
    chat = to_chat(request(system=[{"type": "text", "text": "One. "}, {"type": "text", "text": "Two."}]))
    assert chat.messages[0].text() == "One. Two."


def test_an_empty_list_of_blocks_is_an_empty_turn() -> None:
    messages = [
        {"role": "user", "content": []},
        {"role": "assistant", "content": []},
        {"role": "user", "content": "Hi"},
    ]
    chat = to_chat(request(messages=messages))
    assert [(m.role, m.text()) for m in chat.messages] == [("user", ""), ("assistant", ""), ("user", "Hi")]


def test_a_tool_round_trip_becomes_tool_calls_and_tool_messages() -> None:
    messages = [
        {"role": "user", "content": "Weather in Paris?"},
        {
            "role": "assistant",
            "content": [
                {"type": "text", "text": "Checking."},
                {"type": "tool_use", "id": "toolu_1", "name": "weather", "input": {"city": "Paris"}},
            ],
        },
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "toolu_1", "content": [{"type": "text", "text": "Sunny"}]},
                {"type": "text", "text": "And tomorrow?"},
            ],
        },
    ]
    chat = to_chat(request(messages=messages, tools=[WEATHER], tool_choice={"type": "auto"}))
    user, assistant, tool, follow_up = chat.messages
    assert isinstance(user, UserMessage)
    assert isinstance(assistant, AssistantMessage) and assistant.text() == "Checking."
    assert assistant.tool_calls[0].id == "toolu_1"
    assert json.loads(assistant.tool_calls[0].function.arguments) == {"city": "Paris"}
    assert isinstance(tool, ToolMessage) and (tool.tool_call_id, tool.text()) == ("toolu_1", "Sunny")
    assert isinstance(follow_up, UserMessage) and follow_up.text() == "And tomorrow?"
    assert chat.tools[0].function.name == "weather" and chat.tools[0].function.parameters == {"type": "object"}
    assert chat.tool_choice == "auto"


def test_a_failed_tool_result_is_marked_for_the_model() -> None:
    messages = [
        {"role": "user", "content": "Go"},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "weather", "input": {}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t", "content": "boom", "is_error": True}]},
    ]
    chat = to_chat(request(messages=messages, tools=[WEATHER]))
    assert chat.messages[-1].text() == ERROR_MARK + "boom"


@pytest.mark.parametrize(
    ("choice", "expected"),
    [
        ({"type": "any"}, "required"),
        ({"type": "none"}, "none"),
        ({"type": "auto"}, "auto"),
    ],
)
def test_tool_choices(choice: dict[str, Any], expected: str) -> None:
    assert to_chat(request(tools=[WEATHER], tool_choice=choice)).tool_choice == expected


def test_a_named_tool_choice_and_no_parallel_calls() -> None:
    chat = to_chat(
        request(tools=[WEATHER], tool_choice={"type": "tool", "name": "weather", "disable_parallel_tool_use": True})
    )
    assert isinstance(chat.tool_choice, NamedToolChoice) and chat.tool_choice.function.name == "weather"
    assert chat.parallel_tool_calls is False


def test_a_named_tool_that_is_not_given_is_refused() -> None:
    with pytest.raises(InvalidRequest) as caught:
        to_chat(request(tools=[WEATHER], tool_choice={"type": "tool", "name": "other"}))
    assert caught.value.param == "tool_choice"


def test_images_become_image_parts() -> None:
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AAAA"}}
    chat = to_chat(request(messages=[{"role": "user", "content": [image, {"type": "text", "text": "What?"}]}]))
    assert chat.messages[0].media_parts() == ["image_url"]
    assert chat.messages[0].content[0].image_url.url == "data:image/png;base64,AAAA"


def test_thinking_is_a_hint_a_model_that_does_not_think_leaves_unused() -> None:
    body = request(thinking={"type": "enabled", "budget_tokens": 1024})
    assert to_chat(body) == to_chat(request()) and body.ignored() == ["thinking"]


TEXT_HELLO = {"type": "text", "text": "Hello"}


def test_a_system_message_inside_the_conversation_stays_where_it_was_sent() -> None:
    turns = [
        {"role": "user", "content": "Hi"},
        {
            "role": "assistant",
            "content": [{"type": "thinking", "thinking": "hm", "signature": "s"}, {"type": "text", "text": "Hello"}],
        },
        {"role": "system", "content": "Answer in French from now on."},
        {"role": "user", "content": "Bye"},
    ]
    body = request(system="Be brief.", messages=turns)
    chat = to_chat(body)
    assert [(m.role, m.text()) for m in chat.messages] == [
        ("system", "Be brief."),
        ("user", "Hi"),
        ("assistant", "Hello"),
        ("system", "Answer in French from now on."),
        ("user", "Bye"),
    ]
    assert body.ignored() == ["messages.1.thinking"]


def test_an_output_format_is_chats_json_schema() -> None:
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    chat = to_chat(request(output_config={"format": {"type": "json_schema", "schema": schema}}))
    assert chat.response_format is not None and chat.response_format.type == "json_schema"
    assert chat.response_format.json_schema.schema_ == schema


def test_an_assistant_prefill_is_continued() -> None:
    chat = to_chat(request(messages=[{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hel"}]))
    assert chat.continue_final_message is True
    assert (chat.messages[-1].role, chat.messages[-1].text()) == ("assistant", "Hel")
    assert to_chat(request()).continue_final_message is False


def test_a_prefill_holds_text_only() -> None:
    call = {"type": "tool_use", "id": "toolu_1", "name": "weather", "input": {}}
    messages = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": [call]}]
    with pytest.raises(InvalidRequest) as caught:
        to_chat(request(messages=messages, tools=[WEATHER]))
    assert caught.value.param == "messages.1.content"


def test_a_tool_result_must_answer_an_earlier_tool_use() -> None:
    content = [{"type": "tool_result", "tool_use_id": "nowhere", "content": "x"}]
    with pytest.raises(InvalidRequest):
        to_chat(request(messages=[{"role": "user", "content": content}]))


def test_count_tokens_bodies_translate_without_sampling_fields() -> None:
    body = {"model": "m", "messages": [{"role": "user", "content": "Hi"}], "tools": [WEATHER]}
    chat = to_chat(CountTokensRequest.model_validate_json(json.dumps(body), strict=True))
    assert chat.max_tokens is None and chat.stop is None and len(chat.tools) == 1
