"""End to end: /metrics after real requests, one log line per request (JSON and text), startup output."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest
from observing import eventually, grew, json_request_lines, sample, scrape, text_request_lines
from servers import DEFAULT_MODEL, Server, start_server

ADMIN_KEY = "admin-key-for-metrics-test-7f3a"
CLIENT_KEY = "sk-client-key-that-must-not-be-logged"
ADMIN = {"Authorization": f"Bearer {ADMIN_KEY}"}
CHAT = "chat.completions"


@pytest.fixture(scope="module")
def json_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """JSON logs and an admin-only /metrics."""
    srv = start_server(
        tmp_path_factory.mktemp("observability"),
        "--log-format",
        "json",
        "--metrics-require-admin",
        env={"TOKENRELAY_ADMIN_KEY": ADMIN_KEY},
    )
    yield srv
    srv.stop()


def chat(server: Server, request_id: str, **kwargs: Any) -> Any:
    client = server.client(api_key=CLIENT_KEY)
    params = {"model": DEFAULT_MODEL, "max_tokens": 4, "temperature": 0, **kwargs}
    return client.chat.completions.create(
        messages=[{"role": "user", "content": "Count to three."}], extra_headers={"X-Request-ID": request_id}, **params
    )


def streamed_usage(stream: Any) -> tuple[Any, int]:
    """The usage chunk of a stream and how many chunks carried text."""
    usage, texts = None, 0
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for choice in chunk.choices:
            content = getattr(choice, "delta", None) and choice.delta.content
            texts += bool(content or getattr(choice, "text", None))
    return usage, texts


def test_startup_says_where_and_what_and_shows_loading(json_server: Server) -> None:
    messages = [json.loads(line)["msg"] for line in json_server.log_lines() if line.startswith("{")]
    assert f"serving {DEFAULT_MODEL} (llama.cpp), smollm2-135m-instruct (llama.cpp)" in messages
    assert any(m.startswith(f"listening on http://127.0.0.1:{json_server.port} ") for m in messages)
    assert f"loading model {DEFAULT_MODEL}: 100%" in messages


def test_metrics_need_the_admin_key_when_protected(json_server: Server) -> None:
    url = f"{json_server.base_url}/metrics"
    assert httpx.get(url).status_code == 401
    assert httpx.get(url, headers={"Authorization": "Bearer wrong"}).status_code == 403
    response = httpx.get(url, headers=ADMIN)
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")


def test_requests_are_counted_timed_and_logged(json_server: Server) -> None:
    before = scrape(json_server, ADMIN)
    plain = chat(json_server, "obs-chat-plain")
    chat_usage, chat_texts = streamed_usage(
        chat(json_server, "obs-chat-stream", stream=True, stream_options={"include_usage": True})
    )
    completion = json_server.client(api_key=CLIENT_KEY).completions.create(
        model=DEFAULT_MODEL,
        prompt="One, two,",
        max_tokens=4,
        stream=True,
        stream_options={"include_usage": True},
        extra_headers={"X-Request-ID": "obs-cmpl-stream"},
    )
    cmpl_usage, cmpl_texts = streamed_usage(completion)
    with pytest.raises(openai.NotFoundError):
        chat(json_server, "obs-unknown-model", model="no-such-model")
    with pytest.raises(openai.BadRequestError):
        chat(json_server, "obs-bad-temperature", temperature=7, stream=True)
    after = scrape(json_server, ADMIN)

    assert plain.id == "chatcmpl-obs-chat-plain"
    served = {"model": DEFAULT_MODEL, "key": ""}
    assert grew(before, after, "tokenrelay_requests_total", endpoint=CHAT, status="200", **served) == 2
    assert grew(before, after, "tokenrelay_requests_total", endpoint="completions", status="200", **served) == 1
    assert grew(before, after, "tokenrelay_requests_total", model="", endpoint=CHAT, status="404", key="") == 1
    assert grew(before, after, "tokenrelay_requests_total", model="", endpoint=CHAT, status="400", key="") == 1

    usages = [plain.usage, chat_usage, cmpl_usage]
    prompt = sum(u.prompt_tokens for u in usages)
    completion_tokens = sum(u.completion_tokens for u in usages)
    cached = sum(u.prompt_tokens_details.cached_tokens for u in usages)
    assert grew(before, after, "tokenrelay_prompt_tokens_total", **served) == prompt
    assert grew(before, after, "tokenrelay_completion_tokens_total", **served) == completion_tokens
    assert grew(before, after, "tokenrelay_cached_tokens_total", **served) == cached
    assert grew(before, after, "tokenrelay_engine_tokens_generated_total", model=DEFAULT_MODEL) >= completion_tokens

    timed = {"model": DEFAULT_MODEL}
    assert grew(before, after, "tokenrelay_time_to_first_token_seconds_count", endpoint=CHAT, **timed) == 2
    assert grew(before, after, "tokenrelay_request_duration_seconds_count", endpoint=CHAT, **timed) == 2
    assert grew(before, after, "tokenrelay_request_duration_seconds_count", endpoint="completions", **timed) == 1
    gaps = grew(before, after, "tokenrelay_inter_token_gap_seconds_count", endpoint="completions", **timed)
    assert gaps >= cmpl_texts - 1 >= 1
    assert chat_texts >= 1

    expected = {
        "obs-chat-plain": (200, False, plain.usage),
        "obs-chat-stream": (200, True, chat_usage),
        "obs-cmpl-stream": (200, True, cmpl_usage),
    }
    for request_id, (status, stream, usage) in expected.items():
        (line,) = eventually(lambda rid=request_id: json_request_lines(json_server, rid))
        assert line["status"] == status
        assert line["stream"] is stream
        assert line["model"] == DEFAULT_MODEL
        assert line["backend"] == "llama.cpp"
        assert line["key"] is None  # no key store yet: a key *name* when there is one, never the key
        assert line["prompt_tokens"] == usage.prompt_tokens
        assert line["completion_tokens"] == usage.completion_tokens
        assert 0 < line["ttft_ms"] <= line["latency_ms"]
    (missing,) = json_request_lines(json_server, "obs-unknown-model")
    assert (missing["status"], missing["error"], missing["model"]) == (404, "model_not_found", "no-such-model")
    (invalid,) = json_request_lines(json_server, "obs-bad-temperature")
    assert invalid["status"] == 400 and invalid["ttft_ms"] is None
    assert (invalid["model"], invalid["stream"]) == (DEFAULT_MODEL, True)  # what it asked for, though refused


def test_busy_slots_while_streaming_and_a_cancelled_request(json_server: Server) -> None:
    before = scrape(json_server, ADMIN)
    body = {"model": DEFAULT_MODEL, "prompt": "Once upon a time", "max_tokens": 200, "stream": True}
    headers = {"X-Request-ID": "obs-cancelled"}
    with (
        httpx.Client(base_url=json_server.base_url, timeout=60) as http,
        http.stream("POST", "/v1/completions", json=body, headers=headers) as response,
    ):
        assert response.status_code == 200
        lines = response.iter_lines()  # kept referenced: a collected iterator would close the connection
        for line in lines:
            if line.startswith("data: {"):
                break
        during = scrape(json_server, ADMIN)
    assert sample(during, "tokenrelay_engine_busy_slots", model=DEFAULT_MODEL) >= 1

    def cancelled_and_idle() -> dict[str, Any] | None:
        after = scrape(json_server, ADMIN)
        labels = {"model": DEFAULT_MODEL, "endpoint": "completions", "key": ""}
        counted = grew(before, after, "tokenrelay_requests_total", status="499", **labels) == 1
        idle = sample(after, "tokenrelay_engine_busy_slots", model=DEFAULT_MODEL) == 0
        return after if counted and idle else None

    eventually(cancelled_and_idle, timeout=30)
    (line,) = json_request_lines(json_server, "obs-cancelled")
    assert line["status"] == 499
    assert line["ttft_ms"] is not None  # it was cut off while generating, not before


def test_every_log_line_is_json_and_holds_no_secret(json_server: Server) -> None:
    log = json_server.log()
    for line in log.splitlines():
        if line.strip():
            json.loads(line)
    assert CLIENT_KEY not in log
    assert ADMIN_KEY not in log


def test_text_log_line_and_open_metrics_by_default(server: Server) -> None:
    assert f"listening on http://127.0.0.1:{server.port} " in server.log()
    before = scrape(server)  # no key: /metrics is open unless metrics_require_admin is set
    reply = server.client(api_key=CLIENT_KEY).completions.create(
        model=DEFAULT_MODEL, prompt="Hello", max_tokens=3, extra_headers={"X-Request-ID": "obs-text-line"}
    )
    after = scrape(server)
    labels = {"model": DEFAULT_MODEL, "endpoint": "completions", "status": "200", "key": ""}
    assert grew(before, after, "tokenrelay_requests_total", **labels) == 1
    (fields,) = eventually(lambda: text_request_lines(server, "obs-text-line"))
    assert fields["status"] == "200"
    assert fields["model"] == DEFAULT_MODEL
    assert fields["backend"] == "llama.cpp"
    assert fields["stream"] == "false"
    assert int(fields["completion_tokens"]) == reply.usage.completion_tokens
    assert float(fields["latency_ms"]) >= float(fields["ttft_ms"]) > 0
    assert "key" not in fields  # absent (None) without a key store; never the key itself
    assert CLIENT_KEY not in server.log()
