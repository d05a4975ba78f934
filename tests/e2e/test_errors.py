"""Every bad request gets a 4xx with the OpenAI error body naming the field — never a 500 or a dropped connection."""

from __future__ import annotations

import copy
import json
import random
from typing import Any

import httpx
import pytest
from helpers import MODEL

CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}
COMPLETION = {"model": MODEL, "prompt": "hi", "max_tokens": 1}


def post(server, path: str, body: Any, **kw: Any) -> httpx.Response:
    with server.http() as http:
        if isinstance(body, bytes | str):
            return http.post(path, content=body, headers={"content-type": "application/json"}, **kw)
        return http.post(path, json=body, **kw)


def assert_error(response: httpx.Response, status: int, param: str | None = None, code: str | None = None) -> dict:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["message"]
    if param is not None:
        assert error["param"] == param
    if code is not None:
        assert error["code"] == code
    return error


CALL = {"id": "call_1", "type": "function", "function": {"name": "add", "arguments": "{}"}}
ASKED = [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": None, "tool_calls": [CALL]}]

CHAT_CASES = [
    ({"temperature": 2.5}, "temperature"),
    ({"temperature": -0.1}, "temperature"),
    ({"top_p": 1.5}, "top_p"),
    ({"presence_penalty": 2.5}, "presence_penalty"),
    ({"frequency_penalty": -3}, "frequency_penalty"),
    ({"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
    ({"top_logprobs": 2}, "top_logprobs"),
    ({"logit_bias": {"5": 150}}, "logit_bias.5"),
    ({"logit_bias": {"abc": 1}}, "logit_bias.abc"),
    ({"logit_bias": {"999999999": 1}}, "logit_bias"),
    ({"stop": ["a", "b", "c", "d", "e"]}, "stop"),
    ({"n": 0}, "n"),
    ({"n": 1000}, "n"),
    ({"stream_options": {"include_usage": True}}, "stream_options"),
    ({"max_tokens": 10**6}, "max_tokens"),
    ({"max_tokens": 0}, "max_tokens"),
    ({"temperature": "hot"}, "temperature"),
    ({"messages": "hello"}, "messages"),
    ({"messages": []}, "messages"),
    ({"messages": [{"role": "wizard", "content": "x"}]}, "messages.0"),
    ({"stream": "yes"}, "stream"),
    ({"seed": 1.5}, "seed"),
    ({"response_format": {"type": "json_schema"}}, "response_format"),
    ({"messages": [{"role": "user", "content": "hi"}, {"role": "tool", "content": "4"}]}, "messages.1.tool_call_id"),
    ({"messages": [{"role": "tool", "content": "4", "tool_call_id": "call_1"}]}, "messages.0.tool_call_id"),
    ({"messages": [*ASKED, {"role": "tool", "content": "4", "tool_call_id": "call_2"}]}, "messages.2.tool_call_id"),
]


@pytest.mark.parametrize(("change", "param"), CHAT_CASES)
def test_chat_field_violations(server, change: dict, param: str) -> None:
    error = assert_error(post(server, "/v1/chat/completions", CHAT | change), 400, param)
    assert error["type"] == "invalid_request_error"


COMPLETION_CASES = [
    ({"logprobs": 21}, "logprobs"),
    ({"logprobs": -1}, "logprobs"),
    ({"best_of": 0}, "best_of"),
    ({"prompt": []}, "prompt"),
    ({"prompt": [[]]}, "prompt.0"),
    ({"prompt": 12}, "prompt"),
    ({"prompt": "x " * 40000, "max_tokens": 1}, "prompt"),  # more than the model's 32,768-token context
    ({"echo": "true"}, "echo"),
    ({"suffix": 3}, "suffix"),
]


@pytest.mark.parametrize(("change", "param"), COMPLETION_CASES)
def test_completion_field_violations(server, change: dict, param: str) -> None:
    assert_error(post(server, "/v1/completions", COMPLETION | change), 400, param)


def test_a_tool_message_answering_an_earlier_call_is_accepted(server) -> None:
    answered = [*ASKED, {"role": "tool", "content": "4", "tool_call_id": "call_1"}]
    assert post(server, "/v1/chat/completions", CHAT | {"messages": answered}).status_code == 200


def test_context_window_overflow_names_the_cause(server) -> None:
    error = assert_error(post(server, "/v1/completions", COMPLETION | {"max_tokens": 100000}), 400, "max_tokens")
    assert error["code"] == "context_length_exceeded"


def test_unknown_model_is_404_model_not_found(server) -> None:
    for path, body in (("/v1/chat/completions", CHAT), ("/v1/completions", COMPLETION)):
        assert_error(post(server, path, body | {"model": "no-such-model"}), 404, "model", "model_not_found")
    with server.http() as http:
        assert_error(http.get("/v1/models/no-such-model"), 404, code="model_not_found")


@pytest.mark.parametrize("raw", [b"{bad json", b"", b"[]", b"null", b'"text"', b"\xff\xfe", b'{"model": NaN}'])
def test_malformed_bodies(server, raw: bytes) -> None:
    assert_error(post(server, "/v1/chat/completions", raw), 400)


DEEP_BODIES = {
    "/v1/chat/completions": "openai",
    "/v1/completions": "openai",
    "/v1/responses": "openai",
    "/v1/embeddings": "openai",
    "/tokenize": "openai",
    "/v1/messages": "anthropic",
    "/v1/messages/count_tokens": "anthropic",
}


@pytest.mark.parametrize("depth", [1_000, 200_000])
@pytest.mark.parametrize("path", list(DEEP_BODIES))
def test_a_deeply_nested_body_is_a_400_in_the_endpoints_shape(server, path: str, depth: int) -> None:
    nested = f'{{"model": "{MODEL}", "x": {"[" * depth}{"]" * depth}}}'
    response = post(server, path, nested)
    if DEEP_BODIES[path] == "openai":
        assert_error(response, 400, code="invalid_json")
    else:
        assert response.status_code == 400, response.text
        assert response.json()["type"] == "error" and response.json()["error"]["type"] == "invalid_request_error"
    assert post(server, "/v1/chat/completions", CHAT).status_code == 200


def test_a_body_past_the_limit_is_413_and_the_server_goes_on(server) -> None:
    filler = "x" * (33 << 20)  # past the 32 MiB limit, sent in many ASGI messages
    big = json.dumps(CHAT | {"messages": [{"role": "user", "content": filler}]})
    assert_error(post(server, "/v1/chat/completions", big), 413, code="request_too_large")
    assert post(server, "/v1/chat/completions", CHAT).status_code == 200


def test_unknown_fields_are_accepted_and_ignored(server) -> None:
    response = post(server, "/v1/chat/completions", CHAT | {"frobnicate": True, "x_extra": {"a": 1}})
    assert response.status_code == 200


def test_unknown_path_and_wrong_method_use_the_error_body(server) -> None:
    with server.http() as http:
        assert_error(http.get("/v1/nothing-here"), 404)
        assert_error(http.get("/v1/chat/completions"), 405)


# A few hundred random bad requests: each mutates a valid body in one way that must be rejected.
BAD_VALUES: list[Any] = [None, -1, 3.7, 10**20, -(10**20), "", "x" * 300, [], [1, "a"], {}, {"a": [None]}, True]
CHAT_FIELDS = [
    "model",
    "messages",
    "temperature",
    "top_p",
    "n",
    "max_tokens",
    "presence_penalty",
    "frequency_penalty",
    "logit_bias",
    "stop",
    "stream",
    "seed",
    "logprobs",
    "top_logprobs",
    "tools",
    "tool_choice",
    "response_format",
    "stream_options",
    "max_completion_tokens",
    "user",
    "service_tier",
]
COMPLETION_FIELDS = [
    "model",
    "prompt",
    "temperature",
    "top_p",
    "n",
    "max_tokens",
    "logprobs",
    "echo",
    "best_of",
    "suffix",
    "stop",
    "seed",
    "logit_bias",
    "stream",
    "user",
]


BOOL_FIELDS = {"stream", "logprobs", "echo"}


def mutate(rng: random.Random, base: dict, fields: list[str]) -> dict | None:
    """One field set to a value that field must reject, or None when the draw happens to be valid."""
    body = copy.deepcopy(base)
    field, value = rng.choice(fields), rng.choice(BAD_VALUES)
    body[field] = value
    valid = (
        (value is None and field not in ("model", "messages", "prompt"))  # null means the default
        or (field in ("user", "service_tier", "suffix", "prompt") and isinstance(value, str))
        or (field == "stop" and (value == [] or (isinstance(value, str) and value)))
        or (field == "seed" and type(value) is int and abs(value) < 2**63)
        or (field in BOOL_FIELDS and isinstance(value, bool))
        or (field == "logit_bias" and value == {})
        or (field == "logprobs" and base is COMPLETION and type(value) is int and 0 <= value <= 20)
    )
    return None if valid else body


def test_hundreds_of_random_bad_requests_get_4xx_error_bodies(server) -> None:
    rng = random.Random(20261129)
    sent = 0
    with server.http() as http:
        while sent < 300:
            path, base, fields = rng.choice(
                [("/v1/chat/completions", CHAT, CHAT_FIELDS), ("/v1/completions", COMPLETION, COMPLETION_FIELDS)]
            )
            body = mutate(rng, base, fields)
            if body is None:
                continue
            response = http.post(path, content=json.dumps(body), headers={"content-type": "application/json"})
            assert 400 <= response.status_code < 500, (body, response.status_code, response.text)
            error = response.json()["error"]
            assert error["message"] and error["type"]
            sent += 1
