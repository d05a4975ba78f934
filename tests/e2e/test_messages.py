"""`/v1/messages` and `/v1/messages/count_tokens` on the embedded engine, through the official `anthropic` client,
against a server with keys (so the ledger and limits are those of real calls)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import anthropic
import httpx
import jsonschema
import pytest
from accounting_support import create_key, ledger_rows, sqlite_url
from openai import OpenAI
from pydantic import BaseModel, Field
from servers import Server, start_server

CHAT_MODEL = "smollm2-135m-instruct"
ASK = [{"role": "user", "content": "Name three colours."}]
WEATHER = {
    "name": "get_weather",
    "description": "Current weather in a city.",
    "input_schema": {
        "type": "object",
        "properties": {"city": {"type": "string", "maxLength": 24}},
        "required": ["city"],
    },
}


@dataclass
class Deployment:
    server: Server
    url: str
    keys: dict[str, str]

    def client(self, key: str = "plain", **kwargs: Any) -> anthropic.Anthropic:
        return anthropic.Anthropic(base_url=self.server.base_url, api_key=self.keys[key], max_retries=0, **kwargs)


@pytest.fixture(scope="module")
def deployment(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    tmp = tmp_path_factory.mktemp("messages")
    url = sqlite_url(tmp)
    keys = {"plain": create_key(url, "plain"), "budget": create_key(url, "budget", "--budget-tokens", "60")}
    server = start_server(tmp, "--database-url", url, "--slots", "2", "--threads", "1")
    try:
        yield Deployment(server, url, keys)
    finally:
        server.stop()


def greedy(client: anthropic.Anthropic, extra: dict[str, Any] | None = None, **fields: Any) -> anthropic.types.Message:
    """A greedy message. This client version no longer lists the sampling fields, so they go in `extra_body`."""
    body: dict[str, Any] = {"model": CHAT_MODEL, "max_tokens": 16, "messages": ASK, **fields}
    return client.messages.create(**body, extra_body={"temperature": 0, **(extra or {})})


def text_of(message: anthropic.types.Message) -> str:
    return "".join(block.text for block in message.content if block.type == "text")


# Messages -------------------------------------------------------------------------------------------
def test_a_message_and_its_usage(deployment: Deployment) -> None:
    reply = greedy(deployment.client(), system="Answer briefly.")
    assert reply.id.startswith("msg_") and reply.type == "message" and reply.role == "assistant"
    assert reply.model == CHAT_MODEL
    assert reply.content and reply.content[0].type == "text" and text_of(reply)
    assert reply.stop_reason in ("end_turn", "max_tokens") and reply.stop_sequence is None
    assert 1 <= reply.usage.output_tokens <= 16
    assert reply.usage.input_tokens + reply.usage.cache_read_input_tokens > 0
    assert reply.usage.cache_creation_input_tokens == 0


def test_max_tokens_ends_with_stop_reason_max_tokens(deployment: Deployment) -> None:
    reply = greedy(deployment.client(), max_tokens=3, messages=[{"role": "user", "content": "Count from 1 to 100."}])
    assert reply.stop_reason == "max_tokens"
    assert reply.usage.output_tokens == 3


def test_a_stop_sequence_cuts_the_text_and_is_named(deployment: Deployment) -> None:
    client = deployment.client()
    full = text_of(greedy(client))
    words = full.split()
    assert len(words) >= 2, full
    stop = words[1]
    reply = greedy(client, stop_sequences=["never-in-the-text", stop])
    assert (reply.stop_reason, reply.stop_sequence) == ("stop_sequence", stop)
    assert text_of(reply) == full[: full.index(stop)]


def test_the_stream_assembles_the_same_text_as_the_message(deployment: Deployment) -> None:
    client = deployment.client()
    body: dict[str, Any] = {"model": CHAT_MODEL, "max_tokens": 16, "messages": ASK, "extra_body": {"temperature": 0}}
    whole = client.messages.create(**body)
    with client.messages.stream(**body) as stream:
        started = [event for event in stream if event.type == "message_start"]
    with client.messages.stream(**body) as stream:
        deltas = list(stream.text_stream)
        final = stream.get_final_message()
    assert len(deltas) > 1
    # message_start already carries the prompt's size, counted before the answer (cache reads included)
    prompt = whole.usage.input_tokens + (whole.usage.cache_read_input_tokens or 0)
    assert started and started[0].message.usage.input_tokens == prompt > 0
    assert "".join(deltas) == text_of(final) == text_of(whole)
    assert final.stop_reason == whole.stop_reason
    assert final.usage.output_tokens == whole.usage.output_tokens
    assert final.usage.input_tokens + final.usage.cache_read_input_tokens == (
        whole.usage.input_tokens + whole.usage.cache_read_input_tokens
    )


def test_count_tokens_is_the_prompt_the_message_evaluates(deployment: Deployment) -> None:
    client = deployment.client()
    for fields in ({"system": "Be kind."}, {"tools": [WEATHER]}):
        counted = client.messages.count_tokens(model=CHAT_MODEL, messages=ASK, **fields)
        reply = greedy(client, max_tokens=2, **fields)
        assert counted.input_tokens == reply.usage.input_tokens + reply.usage.cache_read_input_tokens
    # The second identical request reads its prompt from the KV cache: input_tokens counts only the rest.
    again = greedy(client, max_tokens=2, tools=[WEATHER])
    assert again.usage.cache_read_input_tokens > 0
    assert again.usage.input_tokens + again.usage.cache_read_input_tokens == counted.input_tokens


# Tools ----------------------------------------------------------------------------------------------
def test_a_tool_round_trip(deployment: Deployment) -> None:
    client = deployment.client()
    question = [{"role": "user", "content": "What is the weather in Paris?"}]
    forced = {"type": "tool", "name": "get_weather"}
    call = greedy(client, max_tokens=40, messages=question, tools=[WEATHER], tool_choice=forced)
    [use] = [block for block in call.content if block.type == "tool_use"]
    assert use.id.startswith("toolu_") and use.name == "get_weather"
    jsonschema.validate(use.input, WEATHER["input_schema"])
    assert call.stop_reason == "tool_use"
    result = {"type": "tool_result", "tool_use_id": use.id, "content": "Sunny, 21 degrees."}
    history = [*question, {"role": "assistant", "content": call.content}, {"role": "user", "content": [result]}]
    answer = greedy(client, max_tokens=12, messages=history, tools=[WEATHER], tool_choice={"type": "none"})
    assert answer.content[0].type == "text" and text_of(answer)
    assert answer.stop_reason in ("end_turn", "max_tokens")


def test_a_streamed_tool_call_arrives_as_input_json(deployment: Deployment) -> None:
    body: dict[str, Any] = {
        "model": CHAT_MODEL,
        "max_tokens": 40,
        "extra_body": {"temperature": 0},
        "messages": [{"role": "user", "content": "Weather in Oslo?"}],
        "tools": [WEATHER],
        "tool_choice": {"type": "any"},
    }
    with deployment.client().messages.stream(**body) as stream:
        final = stream.get_final_message()
    [use] = [block for block in final.content if block.type == "tool_use"]
    jsonschema.validate(use.input, WEATHER["input_schema"])
    assert final.stop_reason == "tool_use"


# Keys, errors, ledger -------------------------------------------------------------------------------
def test_a_prefill_is_continued_and_only_the_new_text_comes_back(deployment: Deployment) -> None:
    prefill_text = "The first colour is"
    prefill = [*ASK, {"role": "assistant", "content": prefill_text}]
    client = deployment.client()
    message = greedy(client, messages=prefill, max_tokens=6)
    assert text_of(message) and not text_of(message).startswith(prefill_text)
    # The prompt is the question's, its assistant turn opened, and the prefill's tokens: the turn is left open.
    asked = client.messages.count_tokens(model=CHAT_MODEL, messages=ASK).input_tokens
    bearer = {"Authorization": f"Bearer {deployment.keys['plain']}"}
    with httpx.Client(base_url=deployment.server.base_url, headers=bearer) as http:
        tokens = http.post("/tokenize", json={"model": CHAT_MODEL, "prompt": prefill_text}).json()["count"]
    assert client.messages.count_tokens(model=CHAT_MODEL, messages=prefill).input_tokens == asked + tokens
    # Chat offers the same as vLLM's `continue_final_message`, and continues alike.
    chat = OpenAI(base_url=f"{deployment.server.base_url}/v1", api_key=deployment.keys["plain"], max_retries=0)
    continued = chat.chat.completions.create(
        model=CHAT_MODEL, messages=prefill, max_tokens=6, temperature=0, extra_body={"continue_final_message": True}
    )
    assert continued.choices[0].message.content == text_of(message)


def test_keys_by_x_api_key_or_bearer(deployment: Deployment) -> None:
    key = deployment.keys["plain"]
    bearer = anthropic.Anthropic(base_url=deployment.server.base_url, auth_token=key, api_key=None, max_retries=0)
    assert greedy(bearer, max_tokens=2).usage.output_tokens == 2
    assert greedy(deployment.client(), max_tokens=2).usage.output_tokens == 2
    with httpx.Client(base_url=deployment.server.base_url) as http:
        missing = http.post("/v1/messages", json={"model": CHAT_MODEL, "max_tokens": 2, "messages": ASK})
    assert missing.status_code == 401
    assert missing.json()["error"]["type"] == "authentication_error" and missing.json()["type"] == "error"
    wrong = anthropic.Anthropic(base_url=deployment.server.base_url, api_key="tr-wrong", max_retries=0)
    with pytest.raises(anthropic.AuthenticationError):
        greedy(wrong)


@pytest.mark.parametrize(
    ("fields", "named"),
    [
        ({"extra": {"temperature": 1.5}}, "temperature"),
        ({"messages": []}, "messages"),
    ],
)
def test_bad_requests_are_400s_in_anthropics_shape(deployment: Deployment, fields: dict[str, Any], named: str) -> None:
    with pytest.raises(anthropic.BadRequestError) as caught:
        greedy(deployment.client(), **fields)
    assert caught.value.body["type"] == "error"
    assert caught.value.body["error"]["type"] == "invalid_request_error"
    assert named in caught.value.body["error"]["message"]


def test_an_image_on_a_text_only_model_is_a_400_saying_so(deployment: Deployment) -> None:
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}}
    with pytest.raises(anthropic.BadRequestError) as caught:
        greedy(deployment.client(), messages=[{"role": "user", "content": [image, {"type": "text", "text": "What?"}]}])
    assert "text-only" in caught.value.body["error"]["message"]


def test_an_unknown_model_is_404(deployment: Deployment) -> None:
    with pytest.raises(anthropic.NotFoundError) as caught:
        greedy(deployment.client(), model="no-such-model")
    assert caught.value.body["error"]["type"] == "not_found_error"
    with pytest.raises(anthropic.NotFoundError):
        deployment.client().messages.count_tokens(model="no-such-model", messages=ASK)


def test_calls_are_in_the_ledger_as_messages(deployment: Deployment) -> None:
    client = deployment.client()
    reply = greedy(client, max_tokens=4, metadata={"user_id": "ledger-user"})
    deadline = time.monotonic() + 10
    rows: list[dict[str, Any]] = []
    while not rows and time.monotonic() < deadline:
        rows = [r for r in ledger_rows(deployment.url) if r["request_id"] == reply.id.removeprefix("msg_")]
        time.sleep(0.1)
    [row] = rows
    assert (row["endpoint"], row["model"], row["key_name"], row["user"]) == (
        "messages",
        CHAT_MODEL,
        "plain",
        "ledger-user",
    )
    assert row["completion_tokens"] == reply.usage.output_tokens
    assert row["prompt_tokens"] == reply.usage.input_tokens + reply.usage.cache_read_input_tokens


def test_a_spent_budget_is_a_rate_limit_error(deployment: Deployment) -> None:
    client = deployment.client("budget")
    with pytest.raises(anthropic.RateLimitError) as caught:
        for _ in range(10):  # the budget (60 tokens) cannot take ten prompts
            greedy(client, max_tokens=4)
    assert caught.value.body["error"]["type"] == "rate_limit_error"


# What Anthropic's clients ask besides messages ------------------------------------------------------------
def test_anthropic_clients_list_the_models_in_anthropics_shape(deployment: Deployment) -> None:
    listed = deployment.client().models.list()
    assert CHAT_MODEL in [model.id for model in listed.data]
    assert all(model.type == "model" and model.created_at.year >= 1970 for model in listed.data)
    bearer = {"Authorization": f"Bearer {deployment.keys['plain']}"}
    openai_shape = httpx.get(f"{deployment.server.base_url}/v1/models", headers=bearer)
    assert openai_shape.json()["object"] == "list"


def test_a_server_is_found_with_head_and_answers_name_the_request(deployment: Deployment) -> None:
    assert httpx.head(f"{deployment.server.base_url}/").status_code == 200
    raw = deployment.client().messages.with_raw_response.create(model=CHAT_MODEL, max_tokens=4, messages=ASK)  # type: ignore[arg-type]
    assert raw.headers["request-id"] == raw.headers["x-request-id"]


class Colour(BaseModel):
    colour: str = Field(max_length=12)


def test_a_structured_answer_is_parsed_as_the_sdk_asks_for_it(deployment: Deployment) -> None:
    """`messages.parse(output_format=...)` sends `output_config.format`: the answer follows its schema."""
    message = deployment.client().messages.parse(
        model=CHAT_MODEL,
        max_tokens=40,
        messages=[{"role": "user", "content": "Name a colour as JSON."}],
        output_format=Colour,
        extra_body={"temperature": 0},
    )
    assert isinstance(message.parsed_output, Colour)
