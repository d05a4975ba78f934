"""The Responses API on the embedded engine, through the official client: create, stream, store, tools, errors."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import jsonschema
import openai
import pytest
from accounting_support import FAST_CACHE, create_key, ledger_rows, sqlite_url
from servers import Server, start_server

MODEL = "smollm2-135m-instruct"
GREEDY: dict[str, Any] = {"model": MODEL, "temperature": 0, "max_output_tokens": 16}
CONTEXT = 2048  # the long slot's: what a request may use
BOOLEAN = {
    "type": "json_schema",
    "name": "answer",
    "schema": {
        "type": "object",
        "properties": {"yes": {"type": "boolean"}},
        "required": ["yes"],
        "additionalProperties": False,
    },
    "strict": True,
}
WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "Current weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20}}, "required": ["city"]},
    "strict": True,
}


@dataclass
class Deployment:
    server: Server
    url: str
    keys: dict[str, str]

    def client(self, key: str = "alice") -> openai.OpenAI:
        return self.server.client(api_key=self.keys[key])


@pytest.fixture(scope="module")
def deployment(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    tmp = tmp_path_factory.mktemp("responses")
    url = sqlite_url(tmp)
    keys = {"alice": create_key(url, "alice"), "bob": create_key(url, "bob")}
    engine = ("--slots", "2", "--threads", "1", "--max-context", str(CONTEXT))
    server = start_server(tmp, "--database-url", url, *engine, env=FAST_CACHE)
    try:
        yield Deployment(server, url, keys)
    finally:
        server.stop()


@pytest.fixture(scope="module")
def client(deployment: Deployment) -> openai.OpenAI:
    return deployment.client()


def test_a_string_input_gets_a_completed_response(client: openai.OpenAI) -> None:
    response = client.responses.create(input="Say hello.", **GREEDY)
    assert response.id.startswith("resp_") and response.object == "response" and response.model == MODEL
    assert response.status in ("completed", "incomplete") and response.output_text.strip()
    message = response.output[0]
    assert message.type == "message" and message.id.startswith("msg_") and message.role == "assistant"
    assert message.content[0].type == "output_text" and message.content[0].annotations == []
    usage = response.usage
    assert usage is not None and usage.input_tokens > 0 and usage.output_tokens > 0
    assert usage.total_tokens == usage.input_tokens + usage.output_tokens
    assert response.store is True and response.truncation == "disabled" and response.error is None


def test_items_and_instructions_shape_the_answer_and_are_echoed(client: openai.OpenAI) -> None:
    items = [
        {"role": "user", "content": "My name is Ada."},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Hello Ada!"}]},
        {"role": "user", "content": [{"type": "input_text", "text": "What is my name?"}]},
    ]
    response = client.responses.create(input=items, instructions="Answer in one word.", metadata={"t": "1"}, **GREEDY)
    assert response.instructions == "Answer in one word." and response.metadata == {"t": "1"}
    # The same conversation through chat, greedy: the model saw exactly these turns, in this order.
    messages = [
        {"role": "system", "content": "Answer in one word."},
        {"role": "user", "content": "My name is Ada."},
        {"role": "assistant", "content": "Hello Ada!"},
        {"role": "user", "content": "What is my name?"},
    ]
    assert response.output_text == chat_text(client, messages)


def chat_text(client: openai.OpenAI, messages: list[dict[str, Any]]) -> str:
    chat = client.chat.completions.create(model=MODEL, messages=messages, temperature=0, max_tokens=16)  # type: ignore[arg-type]
    return chat.choices[0].message.content or ""


def test_a_token_limit_leaves_the_response_incomplete(client: openai.OpenAI) -> None:
    response = client.responses.create(model=MODEL, input="Write a long story about a cat.", max_output_tokens=3)
    assert response.status == "incomplete" and response.incomplete_details is not None
    assert response.incomplete_details.reason == "max_output_tokens"
    assert response.usage is not None and response.usage.output_tokens == 3 and response.max_output_tokens == 3


def test_the_stream_helper_assembles_what_the_plain_request_returns(client: openai.OpenAI) -> None:
    # A schema ends the answer by itself, so the stream completes (the SDK's helper wants `response.completed`).
    body = {"input": "Is the sky blue?", "text": {"format": BOOLEAN}, **GREEDY, "max_output_tokens": 24}
    plain = client.responses.create(**body)
    assert plain.status == "completed"
    deltas: list[str] = []
    kinds: list[str] = []
    with client.responses.stream(**body) as stream:
        for event in stream:
            kinds.append(event.type)
            if event.type == "response.output_text.delta":
                deltas.append(event.delta)
        final = stream.get_final_response()
    assert "".join(deltas) == final.output_text == plain.output_text and len(deltas) > 1
    assert kinds[:4] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ]
    assert kinds[-1] == "response.completed" and final.status == "completed"
    assert client.responses.retrieve(final.id).output_text == plain.output_text


def test_a_stream_cut_by_the_token_limit_ends_incomplete(client: openai.OpenAI) -> None:
    body = {"input": "Write a long story about a cat.", **GREEDY, "max_output_tokens": 4}
    plain = client.responses.create(**body)
    with client.responses.stream(**body) as stream:
        events = list(stream)
    assert events[-1].type == "response.incomplete" and plain.status == "incomplete"
    done = events[-1].response
    assert done.incomplete_details.reason == "max_output_tokens" and done.output_text == plain.output_text


def test_the_raw_stream_names_each_event_and_numbers_them(deployment: Deployment) -> None:
    headers = {"Authorization": f"Bearer {deployment.keys['alice']}"}
    body = {"input": "Hi", "stream": True, **GREEDY, "max_output_tokens": 4}
    with deployment.server.http(headers=headers) as http, http.stream("POST", "/v1/responses", json=body) as reply:
        text = reply.read().decode()
    frames = [frame.split("\n") for frame in text.strip().split("\n\n")]
    names = [lines[0].removeprefix("event: ") for lines in frames]
    payloads = [json.loads(lines[1].removeprefix("data: ")) for lines in frames]
    assert names == [p["type"] for p in payloads] and "[DONE]" not in text
    assert [p["sequence_number"] for p in payloads] == list(range(len(payloads)))


def test_a_stored_response_is_retrieved_listed_continued_and_deleted(deployment: Deployment) -> None:
    alice, bob = deployment.client("alice"), deployment.client("bob")
    first = alice.responses.create(input="My favourite colour is green.", **GREEDY)
    assert alice.responses.retrieve(first.id).output_text == first.output_text
    items = alice.responses.input_items.list(first.id)
    assert [item.type for item in items.data] == ["message"] and items.data[0].id.startswith("msg_")
    assert items.first_id == items.data[0].id and items.has_more is False
    follow = alice.responses.create(input="What is my favourite colour?", previous_response_id=first.id, **GREEDY)
    assert follow.previous_response_id == first.id
    conversation = [
        {"role": "user", "content": "My favourite colour is green."},
        {"role": "assistant", "content": first.output_text},
        {"role": "user", "content": "What is my favourite colour?"},
    ]
    assert follow.output_text == chat_text(alice, conversation)
    with pytest.raises(openai.NotFoundError):
        bob.responses.retrieve(first.id)
    with pytest.raises(openai.NotFoundError) as caught:
        bob.responses.create(input="x", previous_response_id=first.id, **GREEDY)
    assert caught.value.body["param"] == "previous_response_id"
    deleted = alice.responses.delete(first.id)
    assert deleted is None or getattr(deleted, "deleted", True)
    with pytest.raises(openai.NotFoundError):
        alice.responses.retrieve(first.id)


def test_delete_answers_the_deleted_object(deployment: Deployment) -> None:
    response = deployment.client().responses.create(input="Hi", **GREEDY, store=True)
    headers = {"Authorization": f"Bearer {deployment.keys['alice']}"}
    with deployment.server.http(headers=headers) as http:
        assert http.delete(f"/v1/responses/{response.id}").json() == {
            "id": response.id,
            "object": "response",
            "deleted": True,
        }
        assert http.delete(f"/v1/responses/{response.id}").status_code == 404


def test_an_unknown_or_unstored_id_is_a_404(client: openai.OpenAI) -> None:
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve("resp_does_not_exist")
    with pytest.raises(openai.NotFoundError) as caught:
        client.responses.create(input="x", previous_response_id="resp_nope", **GREEDY)
    assert caught.value.body["param"] == "previous_response_id"
    unstored = client.responses.create(input="Hi", store=False, **GREEDY)
    assert unstored.store is False
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(unstored.id)


def test_a_tool_round_trip(client: openai.OpenAI) -> None:
    question = [{"role": "user", "content": "What is the weather in Paris?"}]
    first = client.responses.create(
        model=MODEL, input=question, tools=[WEATHER], tool_choice="required", max_output_tokens=48, temperature=0
    )
    calls = [item for item in first.output if item.type == "function_call"]
    assert calls and calls[0].name == "get_weather" and calls[0].id.startswith("fc_") and calls[0].call_id
    jsonschema.validate(json.loads(calls[0].arguments), WEATHER["parameters"])
    answer = {"type": "function_call_output", "call_id": calls[0].call_id, "output": '{"temperature_c": 21}'}
    # The output items go back as the SDK returned them; then the same turn again, continued by id instead.
    second = client.responses.create(
        input=[*question, *first.output, answer], tools=[WEATHER], tool_choice="none", **GREEDY
    )
    assert second.output[0].type == "message" and second.output_text
    chained = client.responses.create(
        input=[answer], previous_response_id=first.id, tools=[WEATHER], tool_choice="none", **GREEDY
    )
    assert chained.output_text == second.output_text


def test_streamed_tool_calls_assemble(client: openai.OpenAI) -> None:
    body = {
        "model": MODEL,
        "input": "Weather in Rome?",
        "tools": [WEATHER],
        "tool_choice": "required",
        "max_output_tokens": 48,
    }
    with client.responses.stream(**body, temperature=0) as stream:
        kinds = [event.type for event in stream]
        final = stream.get_final_response()
    call = next(item for item in final.output if item.type == "function_call")
    assert json.loads(call.arguments)["city"] and "response.function_call_arguments.done" in kinds


def test_a_custom_tool_is_called_with_text_and_its_output_goes_back(client: openai.OpenAI) -> None:
    shell = {"type": "custom", "name": "shell", "description": "Runs one shell command line."}
    ask = [{"role": "user", "content": "List the files here."}]
    forced = {"tools": [shell], "tool_choice": {"type": "custom", "name": "shell"}, "max_output_tokens": 32}
    first = client.responses.create(model=MODEL, input=ask, temperature=0, **forced)  # type: ignore[arg-type]
    call = next(item for item in first.output if item.type == "custom_tool_call")
    assert call.name == "shell" and isinstance(call.input, str) and call.call_id
    with client.responses.stream(model=MODEL, input=ask, temperature=0, **forced) as stream:  # type: ignore[arg-type]
        kinds = [event.type for event in stream]
        streamed = next(item for item in stream.get_final_response().output if item.type == "custom_tool_call")
    assert "response.custom_tool_call_input.done" in kinds and streamed.input == call.input  # greedy: the same
    answer = {"type": "custom_tool_call_output", "call_id": call.call_id, "output": "README.md"}
    after = client.responses.create(input=[*ask, call, answer], tools=[shell], tool_choice="none", **GREEDY)  # type: ignore[list-item]
    assert after.output[0].type == "message"


def test_a_custom_tools_regex_format_is_enforced(client: openai.OpenAI) -> None:
    code = "[A-Z]{3}-[0-9]{4}"
    ticket = {"type": "custom", "name": "ticket", "format": {"type": "grammar", "syntax": "regex", "definition": code}}
    reply = client.responses.with_raw_response.create(
        model=MODEL,
        input="File a ticket for the broken build.",
        tools=[ticket],  # type: ignore[list-item]
        tool_choice={"type": "custom", "name": "ticket"},  # type: ignore[arg-type]
        max_output_tokens=32,
        temperature=0,
    )
    call = next(item for item in reply.parse().output if item.type == "custom_tool_call")
    assert re.fullmatch(code, call.input)
    assert "tools.0.format" not in reply.headers.get("x-tokenrelay-ignored-fields", "")  # served, so not named


def test_a_custom_tools_lark_grammar_is_enforced_and_a_bad_one_refused(client: openai.OpenAI) -> None:
    lark = 'start: "add " NUMBER " " NUMBER\nNUMBER: /[0-9]{1,4}/\n'
    adder = {"type": "custom", "name": "adder", "format": {"type": "grammar", "syntax": "lark", "definition": lark}}
    forced = {"tools": [adder], "tool_choice": {"type": "custom", "name": "adder"}, "max_output_tokens": 32}
    reply = client.responses.with_raw_response.create(
        model=MODEL,
        input="Add 12 and 30.",
        temperature=0,
        **forced,  # type: ignore[arg-type]
    )
    call = next(item for item in reply.parse().output if item.type == "custom_tool_call")
    assert re.fullmatch("add [0-9]{1,4} [0-9]{1,4}", call.input)
    assert "tools.0.format" not in reply.headers.get("x-tokenrelay-ignored-fields", "")  # served, so not named
    broken = adder | {"format": {"type": "grammar", "syntax": "lark", "definition": "start: undefined_rule\n"}}
    with pytest.raises(openai.BadRequestError) as refused:
        client.responses.create(model=MODEL, input="Add.", tools=[broken], max_output_tokens=8)  # type: ignore[list-item]
    assert refused.value.body["param"] == "tools" and "adder" in refused.value.body["message"]  # type: ignore[index]


def test_a_json_schema_format_yields_valid_json(client: openai.OpenAI) -> None:
    schema = {
        "type": "object",
        "properties": {"n": {"type": "integer"}},
        "required": ["n"],
        "additionalProperties": False,
    }
    fmt = {"format": {"type": "json_schema", "name": "number", "schema": schema, "strict": True}}
    response = client.responses.create(
        model=MODEL, input="Give me a number.", text=fmt, max_output_tokens=24, temperature=0
    )
    jsonschema.validate(json.loads(response.output_text), schema)
    assert response.text.format.type == "json_schema"


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"background": True}, "background"),
        (
            {
                "input": [
                    {"role": "user", "content": [{"type": "input_image", "image_url": "data:image/png;base64,AA"}]}
                ]
            },
            "input.0.content",
        ),
    ],
)
def test_what_cannot_be_served_is_a_400_naming_it(client: openai.OpenAI, extra: dict[str, Any], param: str) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        client.responses.create(**{"input": "x", **GREEDY, **extra})
    assert caught.value.body["param"] == param


def test_a_text_only_model_says_it_cannot_read_images(client: openai.OpenAI) -> None:
    image = {"type": "input_image", "image_url": "data:image/png;base64,AA"}
    with pytest.raises(openai.BadRequestError) as caught:
        client.responses.create(input=[{"role": "user", "content": [image]}], **GREEDY)
    assert "text-only" in caught.value.body["message"] and "input_image" in caught.value.body["message"]


def test_calls_are_in_the_ledger_as_responses(deployment: Deployment, client: openai.OpenAI) -> None:
    raw = client.responses.with_raw_response.create(input="One more.", **GREEDY)
    request_id, usage = raw.headers["x-request-id"], raw.parse().usage
    deadline = time.monotonic() + 10
    rows: list[dict[str, Any]] = []
    while not rows and time.monotonic() < deadline:  # the ledger writes its rows a moment after the answer
        rows = [row for row in ledger_rows(deployment.url) if row["request_id"] == request_id]
        time.sleep(0.2)
    assert usage is not None and len(rows) == 1
    row = rows[0]
    assert (row["endpoint"], row["model"], row["key_name"], row["status"]) == ("responses", MODEL, "alice", 200)
    assert (row["prompt_tokens"], row["completion_tokens"]) == (usage.input_tokens, usage.output_tokens)


def test_the_route_is_in_the_openapi_document(deployment: Deployment) -> None:
    with deployment.server.http() as http:
        document = http.get("/openapi.json").json()
    body = document["paths"]["/v1/responses"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    schema = document["components"]["schemas"][body["$ref"].rsplit("/", 1)[-1]]
    assert "input" in schema["properties"] and "$defs" in schema


def test_truncation_auto_leaves_out_the_oldest_items_that_do_not_fit(client: openai.OpenAI) -> None:
    filler = "The quick brown fox jumps over the lazy dog. " * 25  # some 250 tokens
    items = [{"role": "user", "content": f"Note {i}: {filler}"} for i in range(10)]
    items.append({"role": "user", "content": "Say ok."})
    with pytest.raises(openai.BadRequestError) as caught:
        client.responses.create(input=items, **GREEDY)
    assert caught.value.body["code"] == "context_length_exceeded" and caught.value.body["param"] == "input"
    response = client.responses.create(input=items, truncation="auto", **GREEDY)
    assert response.truncation == "auto" and response.output_text
    assert response.usage is not None and response.usage.input_tokens + response.usage.output_tokens <= CONTEXT
    assert response.usage.input_tokens > 1024  # more than a short slot holds: it ran in the long one
