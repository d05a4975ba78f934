"""The Messages routes over a scripted backend: bodies, stream events, errors in Anthropic's shape, keys, counts."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from starlette.testclient import TestClient

from tokenrelay.backends.base import (
    DeltaFields,
    Event,
    Events,
    Finish,
    PromptCount,
    TextDelta,
    TextRun,
    ToolCallDelta,
    Usage,
)
from tokenrelay.calls.record import Call
from tokenrelay.config import Settings
from tokenrelay.errors import APIError, AuthenticationError, ModelNotFound, Overloaded
from tokenrelay.principal import ANONYMOUS, Principal
from tokenrelay.protocol.chat import ChatCompletionRequest
from tokenrelay.server.app import create_app

BODY = {"model": "fake", "max_tokens": 8, "messages": [{"role": "user", "content": "Hi"}]}


class OneKey:
    async def authenticate(self, token: str | None) -> Principal:
        if token != "the-key":
            raise AuthenticationError("Incorrect API key provided.")
        return ANONYMOUS


class ScriptedBackend:
    """Yields the given events, one batch each (an exception among them is raised in its place), and records
    each request."""

    kind = "fake"

    def __init__(self, script: list[Event | Exception]) -> None:
        self.script = script
        self.requests: list[ChatCompletionRequest] = []

    async def chat(self, request: ChatCompletionRequest, ticket: object) -> AsyncIterator[Events]:
        self.requests.append(request)
        for item in self.script:
            if isinstance(item, Exception):
                raise item
            yield [item]

    async def count_chat_prompt(self, request: ChatCompletionRequest) -> PromptCount:
        return PromptCount(sum(len(m.text()) for m in request.messages))


class FakeServices:
    """The part of `Services` the Messages routes use."""

    def __init__(self, backend: ScriptedBackend) -> None:
        self.verifier = OneKey()
        self.fake = backend
        self.ended: list[Call] = []

    def begin_call(self, call: Call, request: object) -> None:
        call.principal = ANONYMOUS

    async def admit(self, call: Call, body: ChatCompletionRequest) -> ScriptedBackend:
        return await self.backend(body.model)

    async def backend(self, model: str) -> ScriptedBackend:
        if model != "fake":
            raise ModelNotFound(model)
        return self.fake

    def end_call(self, call: Call) -> None:
        self.ended.append(call)


def serve(tmp_path: Path, script: list[Event | Exception]) -> tuple[TestClient, FakeServices]:
    app = create_app(Settings(data_dir=str(tmp_path), models=[]))
    services = FakeServices(ScriptedBackend(script))
    app.state.services = services  # no lifespan: nothing else is needed here
    return TestClient(app, headers={"x-api-key": "the-key", "anthropic-version": "2023-06-01"}), services


def sse_events(response: httpx.Response) -> list[tuple[str, dict[str, Any]]]:
    events = []
    for block in response.text.split("\n\n"):
        if not block.strip():
            continue
        name_line, data_line = block.split("\n")
        name, data = name_line.removeprefix("event: "), json.loads(data_line.removeprefix("data: "))
        assert data["type"] == name
        events.append((name, data))
    return events


def assert_anthropic_error(response: httpx.Response, status: int, kind: str) -> str:
    assert response.status_code == status, response.text
    body = response.json()
    assert body["type"] == "error" and body["error"]["type"] == kind
    return body["error"]["message"]


def test_a_message_with_its_stop_sequence_and_usage(tmp_path: Path) -> None:
    script = [
        TextDelta(0, "Hello"),
        Finish(0, "stop", "END"),
        Usage(prompt_tokens=10, completion_tokens=3, cached_tokens=4),
    ]
    client, services = serve(tmp_path, script)
    response = client.post("/v1/messages", json=BODY | {"stop_sequences": ["END"], "metadata": {"user_id": "u"}})
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["id"].startswith("msg_") and (body["type"], body["role"], body["model"]) == (
        "message",
        "assistant",
        "fake",
    )
    assert body["content"] == [{"type": "text", "text": "Hello"}]
    assert (body["stop_reason"], body["stop_sequence"]) == ("stop_sequence", "END")
    assert body["usage"] == {
        "input_tokens": 6,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": 4,
        "output_tokens": 3,
    }
    [call] = services.ended
    assert (call.endpoint, call.model, call.user, call.usage.completion_tokens) == ("messages", "fake", "u", 3)


@pytest.mark.parametrize(
    ("finish", "expected"),
    [(Finish(0, "stop"), "end_turn"), (Finish(0, "length"), "max_tokens"), (Finish(0, "tool_calls"), "tool_use")],
)
def test_stop_reasons(tmp_path: Path, finish: Finish, expected: str) -> None:
    client, _ = serve(tmp_path, [TextDelta(0, "x"), finish, Usage(1, 1)])
    body = client.post("/v1/messages", json=BODY).json()
    assert (body["stop_reason"], body["stop_sequence"]) == (expected, None)


def test_a_tool_call_is_a_tool_use_block_with_parsed_input(tmp_path: Path) -> None:
    script = [
        ToolCallDelta(0, 0, id="call_abc", name="weather", arguments='{"city": '),
        ToolCallDelta(0, 0, arguments='"Paris"}'),
        Finish(0, "tool_calls"),
        Usage(5, 4),
    ]
    client, _ = serve(tmp_path, script)
    body = client.post("/v1/messages", json=BODY).json()
    assert body["content"] == [{"type": "tool_use", "id": "toolu_abc", "name": "weather", "input": {"city": "Paris"}}]
    assert body["stop_reason"] == "tool_use"


def test_a_stream_of_text_then_a_tool_call(tmp_path: Path) -> None:
    script = [
        TextRun(0, ["Hel", "lo"]),
        ToolCallDelta(0, 0, id="call_1", name="weather", arguments='{"city"'),
        ToolCallDelta(0, 0, arguments=': "Oslo"}'),
        Finish(0, "tool_calls"),
        Usage(prompt_tokens=7, completion_tokens=5, cached_tokens=2),
    ]
    client, _ = serve(tmp_path, script)
    response = client.post("/v1/messages", json=BODY | {"stream": True})
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/event-stream")
    events = sse_events(response)
    assert [name for name, _ in events] == [
        "message_start",
        "ping",
        "content_block_start",
        "content_block_delta",
        "content_block_delta",
        "content_block_stop",
        "content_block_start",
        "content_block_delta",
        "content_block_delta",
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    start = events[0][1]["message"]
    assert start["content"] == [] and start["usage"]["output_tokens"] == 0
    assert [e["delta"]["text"] for _, e in events[3:5]] == ["Hel", "lo"]
    tool_start = events[6][1]
    assert tool_start["index"] == 1
    assert tool_start["content_block"] == {"type": "tool_use", "id": "toolu_1", "name": "weather", "input": {}}
    assert "".join(e["delta"]["partial_json"] for _, e in events[7:9]) == '{"city": "Oslo"}'
    delta = events[10][1]
    assert delta["delta"] == {"stop_reason": "tool_use", "stop_sequence": None}
    assert delta["usage"] == {
        "input_tokens": 5,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": 2,
        "output_tokens": 5,
    }


def test_a_nodes_reasoning_is_a_thinking_block_before_the_answer(tmp_path: Path) -> None:
    script = [
        DeltaFields(0, {"reasoning_content": "The user "}),
        DeltaFields(0, {"reasoning_content": "says hi.", "reasoning": "says hi."}),
        TextDelta(0, "Hello"),
        Finish(0, "stop"),
        Usage(prompt_tokens=3, completion_tokens=6),
    ]
    client, _ = serve(tmp_path, script)
    events = sse_events(client.post("/v1/messages", json=BODY | {"stream": True}))
    blocks = [e["content_block"] for name, e in events if name == "content_block_start"]
    assert blocks == [{"type": "thinking", "thinking": "", "signature": ""}, {"type": "text", "text": ""}]
    deltas = [e["delta"] for name, e in events if name == "content_block_delta" and e["index"] == 0]
    assert [d.get("thinking") for d in deltas if d["type"] == "thinking_delta"] == ["The user ", "says hi."]
    assert deltas[-1] == {"type": "signature_delta", "signature": ""}
    whole = serve(tmp_path, script)[0].post("/v1/messages", json=BODY).json()
    assert whole["content"][0] == {"type": "thinking", "thinking": "The user says hi.", "signature": ""}
    assert whole["content"][1] == {"type": "text", "text": "Hello"}


def test_an_error_before_the_first_byte_is_a_plain_http_error(tmp_path: Path) -> None:
    client, services = serve(tmp_path, [Overloaded("The queue is full.")])
    response = client.post("/v1/messages", json=BODY | {"stream": True})
    assert assert_anthropic_error(response, 529, "overloaded_error") == "The queue is full."
    assert services.ended[0].status == 503


def test_an_error_after_the_first_byte_is_an_error_event(tmp_path: Path) -> None:
    client, _ = serve(tmp_path, [TextDelta(0, "Hi"), APIError("The node went away.")])
    response = client.post("/v1/messages", json=BODY | {"stream": True})
    assert response.status_code == 200
    name, data = sse_events(response)[-1]
    assert name == "error"
    assert data == {"type": "error", "error": {"type": "api_error", "message": "The node went away."}}


def test_keys_by_x_api_key_or_bearer(tmp_path: Path) -> None:
    client, _ = serve(tmp_path, [TextDelta(0, "x"), Finish(0, "stop"), Usage(1, 1)])
    assert client.post("/v1/messages", json=BODY).status_code == 200
    bearer = {"x-api-key": "", "Authorization": "Bearer the-key"}
    assert client.post("/v1/messages", json=BODY, headers=bearer).status_code == 200
    wrong = client.post("/v1/messages", json=BODY, headers={"x-api-key": "wrong"})
    assert_anthropic_error(wrong, 401, "authentication_error")
    assert_anthropic_error(client.get("/v1/messages"), 405, "invalid_request_error")


@pytest.mark.parametrize(
    ("change", "named"),
    [
        ({"max_tokens": 0}, "max_tokens"),
        ({"temperature": 1.5}, "temperature"),
        ({"messages": []}, "messages"),
        ({"messages": [{"role": "user", "content": [{"type": "text", "text": "x", "bold": True}]}]}, "bold"),
        ({"output_config": {"format": {"type": "xml"}}}, "output_config.format.type"),
    ],
)
def test_bad_bodies_are_400s_naming_the_field(tmp_path: Path, change: dict[str, Any], named: str) -> None:
    client, services = serve(tmp_path, [])
    message = assert_anthropic_error(client.post("/v1/messages", json=BODY | change), 400, "invalid_request_error")
    assert named in message
    assert services.fake.requests == []


@pytest.mark.parametrize(
    ("change", "named"),
    [
        ({"frequency_penalty": 1}, "frequency_penalty"),
        ({"thinking": {"type": "adaptive"}}, "thinking"),
        ({"context_management": {"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]}}, "context_management"),
        ({"output_config": {"effort": "high"}}, "output_config.effort"),
        ({"tools": [{"type": "web_search_20250305", "name": "web_search"}]}, "tools.0"),
    ],
)
def test_hints_are_served_and_named_in_the_answer(tmp_path: Path, change: dict[str, Any], named: str) -> None:
    client, services = serve(tmp_path, [TextDelta(0, "x"), Finish(0, "stop"), Usage(1, 1)])
    response = client.post("/v1/messages", json=BODY | change)
    assert response.status_code == 200, response.text
    assert response.headers["x-tokenrelay-ignored-fields"] == named
    assert services.fake.requests[0].tools is None  # a server tool is not shown to the model
    [call] = services.ended
    assert call.ignored == [named]


def test_a_missing_max_tokens_is_a_400(tmp_path: Path) -> None:
    client, _ = serve(tmp_path, [])
    body = {k: v for k, v in BODY.items() if k != "max_tokens"}
    assert "max_tokens" in assert_anthropic_error(client.post("/v1/messages", json=body), 400, "invalid_request_error")


def test_an_unknown_model_is_not_found(tmp_path: Path) -> None:
    client, _ = serve(tmp_path, [])
    assert_anthropic_error(client.post("/v1/messages", json=BODY | {"model": "nope"}), 404, "not_found_error")


def test_count_tokens_asks_the_backend_for_the_translated_prompt(tmp_path: Path) -> None:
    client, services = serve(tmp_path, [])
    body = {"model": "fake", "system": "Sys", "messages": [{"role": "user", "content": "Hello"}]}
    response = client.post("/v1/messages/count_tokens", json=body)
    assert response.status_code == 200, response.text
    assert response.json() == {"input_tokens": len("Sys") + len("Hello")}
    assert services.ended == []  # nothing generated, nothing recorded
    sampled = client.post("/v1/messages/count_tokens", json=body | {"max_tokens": 5})  # what a whole request holds
    assert sampled.json() == response.json() and sampled.headers["x-tokenrelay-ignored-fields"] == "max_tokens"
