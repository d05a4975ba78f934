"""`/v1/chat/completions` on the embedded engine with the default model, through the official client."""

from __future__ import annotations

import concurrent.futures
import re
import time

import httpx
import pytest
from helpers import MODEL, chunks, sse_events, user, validate
from openai import BadRequestError, OpenAI

PROMPT = user("Write a short list of fruits.")


def greedy(client: OpenAI, messages: list[dict], max_tokens: int = 12, **kw: object):
    return client.chat.completions.create(model=MODEL, messages=messages, max_tokens=max_tokens, temperature=0, **kw)


def test_response_shape_usage_and_schema(client: OpenAI) -> None:
    raw = client.chat.completions.with_raw_response.create(model=MODEL, messages=PROMPT, max_tokens=5, temperature=0)
    validate(raw.http_response.json(), "chat_completion")  # the bytes the server sent, not the SDK's model
    reply = raw.parse()
    choice = reply.choices[0]
    assert reply.object == "chat.completion" and reply.model == MODEL
    assert choice.index == 0 and choice.message.role == "assistant"
    assert choice.finish_reason == "length"
    assert reply.usage.completion_tokens == 5
    assert reply.usage.total_tokens == reply.usage.prompt_tokens + 5
    assert reply.usage.prompt_tokens_details.cached_tokens >= 0
    assert reply.system_fingerprint and reply.system_fingerprint.startswith("fp_")


def test_continue_final_message_needs_an_assistant_message_last(client: OpenAI) -> None:
    with pytest.raises(BadRequestError) as info:
        client.chat.completions.create(
            model=MODEL, messages=user("Hi"), max_tokens=2, extra_body={"continue_final_message": True}
        )
    assert info.value.body["param"] == "continue_final_message"


def test_max_completion_tokens_wins_over_max_tokens(client: OpenAI) -> None:
    reply = client.chat.completions.create(
        model=MODEL, messages=PROMPT, max_tokens=9, max_completion_tokens=3, temperature=0
    )
    assert reply.usage.completion_tokens == 3 and reply.choices[0].finish_reason == "length"


def test_greedy_is_deterministic_and_stream_joins_to_the_same_text(client: OpenAI) -> None:
    first = greedy(client, PROMPT).choices[0].message.content
    second = greedy(client, PROMPT).choices[0].message.content
    streamed = "".join(c.choices[0].delta.content or "" for c in greedy(client, PROMPT, stream=True) if c.choices)
    assert first == second == streamed
    assert first


def test_seed_reproduces_sampled_output_and_seeds_differ(client: OpenAI) -> None:
    def sample(seed: int) -> str:
        reply = client.chat.completions.create(
            model=MODEL, messages=PROMPT, max_tokens=16, temperature=1.2, top_p=0.95, seed=seed
        )
        return reply.choices[0].message.content

    assert sample(7) == sample(7)
    assert len({sample(s) for s in (1, 2, 3, 4)}) > 1


def test_stop_sequence_cuts_output_and_never_leaks_in_stream(client: OpenAI, server) -> None:
    full = greedy(client, PROMPT, max_tokens=24).choices[0].message.content
    assert len(full) > 12
    stop = full[6:9]  # a string from the middle of the greedy output, likely split across tokens
    cut = full[: full.index(stop)]
    reply = greedy(client, PROMPT, max_tokens=24, stop=[stop, "@@never@@"])
    assert reply.choices[0].message.content == cut
    assert reply.choices[0].finish_reason == "stop"
    with server.http() as http:
        events = chunks(
            sse_events(
                http,
                "/v1/chat/completions",
                {"model": MODEL, "messages": PROMPT, "max_tokens": 24, "temperature": 0, "stop": stop, "stream": True},
            )
        )
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in events if c["choices"])
    assert text == cut and stop not in text
    assert [c["choices"][0]["finish_reason"] for c in events if c["choices"]][-1] == "stop"


def tokenize(server, text: str) -> list[int]:
    with server.http() as http:
        return http.post("/tokenize", json={"model": MODEL, "prompt": text}).json()["tokens"]


def test_logit_bias_bans_and_forces_tokens(client: OpenAI, server) -> None:
    base = greedy(client, PROMPT, max_tokens=1, logprobs=True, top_logprobs=2)
    chosen = base.choices[0].logprobs.content[0]
    (chosen_id,) = tokenize(server, bytes(chosen.bytes).decode())
    banned = greedy(client, PROMPT, max_tokens=1, logit_bias={str(chosen_id): -100}, logprobs=True)
    assert banned.choices[0].logprobs.content[0].token != chosen.token
    # With the favourite banned, greedy picks the runner-up the first request reported.
    assert banned.choices[0].logprobs.content[0].token == chosen.top_logprobs[1].token
    (hello,) = tokenize(server, "Hello")
    forced = greedy(client, PROMPT, max_tokens=4, logit_bias={str(hello): 100})
    assert forced.choices[0].message.content == "Hello" * 4


def test_frequency_and_presence_penalties_change_greedy_output(client: OpenAI, server) -> None:
    plain = greedy(client, PROMPT, max_tokens=32).choices[0].message.content
    penalised = greedy(client, PROMPT, max_tokens=32, frequency_penalty=2.0, presence_penalty=2.0)
    text = penalised.choices[0].message.content
    assert text != plain

    def repeats(s: str) -> int:
        tokens = tokenize(server, s)
        return len(tokens) - len(set(tokens))

    assert repeats(text) <= repeats(plain)


def test_n_choices_are_indexed_and_counted(client: OpenAI) -> None:
    reply = client.chat.completions.create(model=MODEL, messages=PROMPT, max_tokens=4, n=3, temperature=1.0, seed=3)
    assert [c.index for c in reply.choices] == [0, 1, 2]
    assert reply.usage.completion_tokens == 12
    assert all(c.finish_reason == "length" for c in reply.choices)


def test_logprobs_are_real_and_consistent(client: OpenAI) -> None:
    reply = greedy(client, PROMPT, max_tokens=6, logprobs=True, top_logprobs=3)
    content = reply.choices[0].logprobs.content
    assert len(content) == 6
    assert "".join(bytes(item.bytes).decode("utf-8", "replace") for item in content) == reply.choices[0].message.content
    for item in content:
        assert len(item.top_logprobs) == 3
        values = [t.logprob for t in item.top_logprobs]
        assert values == sorted(values, reverse=True) and all(v <= 0 for v in values)
        # Greedy: the chosen token is the most likely one.
        assert item.token == item.top_logprobs[0].token and item.logprob == pytest.approx(values[0])
    no_top = greedy(client, PROMPT, max_tokens=2, logprobs=True)
    assert all(item.top_logprobs == [] for item in no_top.choices[0].logprobs.content)
    assert greedy(client, PROMPT, max_tokens=2).choices[0].logprobs is None


def test_all_roles_names_and_text_parts_render_through_the_template(client: OpenAI) -> None:
    conversation = [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "What is 2+2?", "name": "alice"},
        {
            "role": "assistant",
            "content": "4",
            "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "add", "arguments": "{}"}}],
        },
        {"role": "tool", "content": "calculator says 4", "tool_call_id": "call_1"},
        {"role": "user", "content": [{"type": "text", "text": "And 3+3?"}]},
    ]
    reply = greedy(client, conversation, max_tokens=3)
    assert reply.choices[0].message.role == "assistant"
    unnamed = [dict(m) for m in conversation]
    unnamed[1].pop("name")
    assert greedy(client, unnamed, max_tokens=1).usage.prompt_tokens < reply.usage.prompt_tokens  # name rendered
    as_parts = greedy(
        client,
        [
            {
                "role": "user",
                "content": [{"type": "text", "text": "Write a short "}, {"type": "text", "text": "list of fruits."}],
            }
        ],
    )
    assert as_parts.choices[0].message.content == greedy(client, PROMPT).choices[0].message.content


def test_image_parts_on_a_text_only_model_are_refused(client: OpenAI) -> None:
    with pytest.raises(BadRequestError) as info:
        greedy(
            client,
            [
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": "What is this?"},
                        {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
                    ],
                }
            ],
        )
    assert "text-only" in info.value.message
    assert info.value.body["param"] == "messages.0.content"


def test_stream_chunks_follow_the_openai_order(server) -> None:
    body = {
        "model": MODEL,
        "messages": PROMPT,
        "max_tokens": 5,
        "temperature": 0,
        "stream": True,
        "n": 2,
        "stream_options": {"include_usage": True},
    }
    with server.http() as http:
        events = chunks(sse_events(http, "/v1/chat/completions", body))
    assert all(c["object"] == "chat.completion.chunk" for c in events)
    assert all("usage" in c for c in events)
    assert all(c["usage"] is None for c in events[:-1])
    last = events[-1]
    assert last["choices"] == [] and last["usage"]["completion_tokens"] == 10
    for index in (0, 1):
        mine = [c["choices"][0] for c in events if c["choices"] and c["choices"][0]["index"] == index]
        assert mine[0]["delta"]["role"] == "assistant"
        assert mine[-1]["finish_reason"] == "length" and mine[-1]["delta"] == {}
        assert all(m["finish_reason"] is None for m in mine[:-1])
    ids = {c["id"] for c in events}
    assert len(ids) == 1
    without = {k: v for k, v in body.items() if k != "stream_options"}
    with server.http() as http:
        plain = chunks(sse_events(http, "/v1/chat/completions", without))
    assert all("usage" not in c for c in plain)


def test_cached_tokens_count_a_shared_prefix(client: OpenAI) -> None:
    long_system = {"role": "system", "content": "You answer questions about geography. " * 30}
    first = greedy(client, [long_system, *user("Where is Paris?")], max_tokens=1)
    second = greedy(client, [long_system, *user("Where is Rome?")], max_tokens=1)
    assert second.usage.prompt_tokens_details.cached_tokens >= 100
    assert second.usage.prompt_tokens_details.cached_tokens < second.usage.prompt_tokens
    assert first.usage.prompt_tokens > 100


def test_service_tier_is_echoed_and_user_accepted(client: OpenAI) -> None:
    reply = greedy(client, PROMPT, max_tokens=1, service_tier="default", user="user-123")
    assert reply.service_tier == "default"


def test_request_id_is_echoed_and_used_in_the_completion_id(server) -> None:
    with server.http() as http:
        response = http.post(
            "/v1/chat/completions",
            headers={"X-Request-ID": "trace-abc-123"},
            json={"model": MODEL, "messages": PROMPT, "max_tokens": 1},
        )
    assert response.headers["x-request-id"] == "trace-abc-123"
    assert response.json()["id"] == "chatcmpl-trace-abc-123"


def engine_status(server) -> dict:
    return httpx.get(f"{server.base_url}/health").json()["models"][MODEL]


def test_client_disconnect_stops_generation(server) -> None:
    body = {"model": MODEL, "messages": PROMPT, "max_tokens": 900, "stream": True, "temperature": 1.0, "stop": []}
    before = engine_status(server)["tokens_generated"]
    with (
        server.http() as http,
        http.stream("POST", "/v1/chat/completions", json=body, headers={"X-Request-ID": "cancel-me-1"}) as response,
    ):
        seen = 0  # tokens the client read before it left
        for line in response.iter_lines():
            seen += line.startswith("data: {") and '"content":"' in line and '"content":""' not in line
            if seen == 6:
                break
    deadline = time.monotonic() + 10
    while engine_status(server)["busy_slots"] and time.monotonic() < deadline:
        time.sleep(0.05)
    status = engine_status(server)
    assert status["busy_slots"] == 0
    time.sleep(0.5)
    assert engine_status(server)["tokens_generated"] == status["tokens_generated"]
    assert status["tokens_generated"] - before < 300  # stopped long before max_tokens
    # The request is accounted as cancelled (499) with the tokens it really consumed.
    deadline = time.monotonic() + 5
    while not (lines := [ln for ln in server.log_lines() if "request_id=cancel-me-1" in ln]):
        assert time.monotonic() < deadline, "no log line for the cancelled request"
        time.sleep(0.1)
    (line,) = lines
    assert "status=499" in line
    generated = int(re.search(r"completion_tokens=(\d+)", line).group(1))
    # Stopped within a few tokens of the client leaving (the README's promise), not at max_tokens.
    assert seen <= generated <= seen + 12, (seen, generated)
    assert int(re.search(r"prompt_tokens=(\d+)", line).group(1)) > 0


def test_concurrent_requests_do_not_corrupt_each_other(client: OpenAI, server) -> None:
    """Eight requests decoded in the same steps, each forced (logit_bias +100) to repeat its own word: every
    reply holds only its own word, the right number of times, and its own usage."""
    words = ["Hello", "apple", "river", "stone", "cloud", "green", "music", "table"]
    ids = {w: tokenize(server, w) for w in words}
    single = [w for w in words if len(ids[w]) == 1]
    assert len(single) >= 6

    def forced(word: str):
        return greedy(client, PROMPT, max_tokens=12, logit_bias={str(ids[word][0]): 100})

    with concurrent.futures.ThreadPoolExecutor(len(single)) as pool:
        replies = list(pool.map(forced, single))
    for word, reply in zip(single, replies, strict=True):
        assert reply.choices[0].message.content == word * 12
        assert reply.usage.completion_tokens == 12


WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
CONTINUED = [*user("Name a colour."), {"role": "assistant", "content": "My favourite colour is"}]


@pytest.mark.parametrize(
    "extra",
    [{}, {"tools": [WEATHER_TOOL]}, {"tools": [WEATHER_TOOL], "tool_choice": "none"}],
    ids=["plain", "tools", "tools-none"],
)
def test_tokenize_with_messages_counts_the_prompt_chat_evaluates(client: OpenAI, server, extra: dict) -> None:
    messages = [{"role": "system", "content": "Be brief."}, *PROMPT]
    with server.http() as http:
        counted = http.post("/tokenize", json={"model": MODEL, "messages": messages, **extra}).json()
    reply = greedy(client, messages, max_tokens=1, **extra)
    assert counted["count"] == len(counted["tokens"]) == reply.usage.prompt_tokens
    assert counted["max_model_len"] > counted["count"]


def test_tokenize_with_messages_follows_continuation_and_the_generation_prompt(client: OpenAI, server) -> None:
    with server.http() as http:

        def count(**body: object) -> int:
            return http.post("/tokenize", json={"model": MODEL, **body}).json()["count"]

        continued = count(messages=CONTINUED, continue_final_message=True)
        reply = greedy(client, CONTINUED, max_tokens=1, extra_body={"continue_final_message": True})
        assert continued == reply.usage.prompt_tokens
        assert count(messages=PROMPT, add_generation_prompt=False) < count(messages=PROMPT)


@pytest.mark.parametrize(
    "body",
    [{"prompt": "hi", "messages": PROMPT}, {"prompt": "hi", "tools": [WEATHER_TOOL]}, {}, {"messages": []}],
    ids=["both", "prompt-with-tools", "neither", "no-messages"],
)
def test_tokenize_takes_one_shape_or_a_400(server, body: dict) -> None:
    with server.http() as http:
        response = http.post("/tokenize", json={"model": MODEL, **body})
    assert response.status_code == 400 and response.json()["error"]["param"]
