"""A default server gives a request the model's whole context: a prompt far longer than a slot runs in a long
slot, beside the short ones, and a client that leaves while its long prompt evaluates frees the slot at once."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import openai
import pytest
from observing import eventually
from servers import Server, start_server

MODEL = "smollm2-135m-instruct"  # trained on 8,192 tokens of context
NEVER_END = {"0": -100, "2": -100}  # SmolLM2's end-of-text tokens: an answer writes all its tokens
WORDS = ("harbour", "ledger", "lantern", "copper", "meadow", "violin", "granite", "orchard", "saddle", "thistle")


def long_text(words: int, salt: str) -> str:
    """Words that do not repeat as a run, so no part of the prompt is a cached copy of another."""
    return " ".join(f"{salt}{i} {WORDS[i * 7 % len(WORDS)]}" for i in range(words // 2))


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    started = start_server(tmp_path_factory.mktemp("long-context"))
    yield started
    started.stop()


def engine(server: Server) -> dict[str, Any]:
    status: dict[str, Any] = httpx.get(f"{server.base_url}/health", timeout=10).json()["models"][MODEL]
    return status


def test_a_default_server_answers_a_six_thousand_token_chat(server: Server) -> None:
    short, long = engine(server)["lanes"]
    assert short["context_per_slot"] == 1024 and long["context_per_slot"] == 8192
    client = server.client(timeout=600)
    ask = [{"role": "user", "content": f"{long_text(3000, 'a')}\nWhich word came first?"}]
    answer = client.chat.completions.create(model=MODEL, messages=ask, max_tokens=4, temperature=0)  # type: ignore[arg-type]
    assert answer.usage is not None and 6000 < answer.usage.prompt_tokens < 8192
    assert answer.choices[0].finish_reason in ("stop", "length")
    with pytest.raises(openai.BadRequestError) as refused:  # the long slot's context is the model's limit
        client.chat.completions.create(model=MODEL, messages=ask, max_tokens=4000)  # type: ignore[arg-type]
    assert refused.value.code == "context_length_exceeded"


def test_a_client_that_leaves_during_a_long_prompt_frees_its_slot(server: Server) -> None:
    body = {"model": MODEL, "messages": [{"role": "user", "content": long_text(3000, "b")}], "stream": True}
    evaluated = engine(server)["prompt_tokens_evaluated"]
    # The stream's headers come with its first token, after the prompt: leave before they do.
    with server.http() as http, contextlib.suppress(httpx.ReadTimeout):
        http.post("/v1/chat/completions", json=body, timeout=httpx.Timeout(600, read=2))

    def idle() -> dict[str, Any] | None:
        status = engine(server)
        return status if status["lanes"][1]["busy_slots"] == 0 else None

    left = eventually(idle, timeout=60)
    assert left["prompt_tokens_evaluated"] - evaluated < 6000  # evaluation stopped partway through the prompt
    assert left["cells_in_use"] == 0


def test_a_next_turn_gives_the_same_answer_from_the_cache_as_without_it(server: Server) -> None:
    """Turn 2 resends turn 1 and its answer: it is read from the long slot's cache up to where a prompt piece
    starts, and answers as it does when the slot holds something else."""
    client = server.client(timeout=600)
    history: list[dict[str, str]] = [{"role": "user", "content": f"{long_text(700, 'c')}\nSum it up."}]

    def turn(messages: list[dict[str, str]]) -> tuple[str, int]:
        answer = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=24, temperature=0)  # type: ignore[arg-type]
        assert answer.usage is not None and answer.usage.prompt_tokens > 1024  # more than a short slot holds
        details = answer.usage.prompt_tokens_details
        return answer.choices[0].message.content or "", details.cached_tokens or 0 if details else 0

    first, _ = turn(history)
    history += [{"role": "assistant", "content": first}, {"role": "user", "content": "And the last word?"}]
    cached_answer, cached = turn(history)
    turn([{"role": "user", "content": f"{long_text(700, 'd')}\nSum it up."}])  # the long slot now holds another
    fresh_answer, fresh = turn(history)
    assert cached > 1024 and fresh == 0
    assert cached_answer == fresh_answer


def test_a_next_turn_after_an_answer_past_a_piece_start_equals_a_fresh_evaluation(server: Server) -> None:
    """Turn 1's answer runs past where a prompt piece starts (position 1,024): its cells, computed one token per
    step, are not reused for turn 2, whose answer is the one a fresh evaluation gives."""
    first_prompt = long_text(800, "e")

    def complete(prompt: str, tokens: int) -> tuple[str, list[float], int]:
        body = {"model": MODEL, "prompt": prompt, "max_tokens": tokens, "temperature": 0, "logprobs": 1}
        reply = server.client(timeout=600).completions.create(**body, logit_bias=NEVER_END)  # type: ignore[arg-type]
        choice, usage = reply.choices[0], reply.usage
        assert choice.logprobs is not None and usage is not None
        details = usage.prompt_tokens_details
        return choice.text, choice.logprobs.token_logprobs or [], (details.cached_tokens or 0) if details else 0

    answer, _, _ = complete(first_prompt, 120)
    second_prompt = f"{first_prompt}{answer} Then:"
    cached_logprobs = complete(second_prompt, 16)
    complete(long_text(900, "f"), 4)  # the long slot now holds another prompt
    fresh_logprobs = complete(second_prompt, 16)
    assert cached_logprobs[2] >= 512 and fresh_logprobs[2] == 0
    assert cached_logprobs[:2] == fresh_logprobs[:2]


def test_a_long_prompt_beside_decoding_streams_gives_the_answer_it_gives_alone(server: Server) -> None:
    """While streams decode in the short slots, a long prompt evaluates beside them on a core of its own
    (`/health` counts its pieces); its answer and log-probabilities are the ones it gets alone."""
    prompt = long_text(1100, "g")  # ~2,200 tokens: pieces of 512 beside the streams

    def complete(text: str) -> tuple[str, list[float]]:
        body = {"model": MODEL, "prompt": text, "max_tokens": 12, "temperature": 0, "logprobs": 1}
        choice = server.client(timeout=600).completions.create(**body).choices[0]  # type: ignore[call-overload]
        assert choice.logprobs is not None
        return choice.text, choice.logprobs.token_logprobs or []

    alone = complete(prompt)
    complete(long_text(600, "h"))  # the long slot now holds another prompt: the next one evaluates whole
    before = engine(server)["pieces_beside"]

    def stream(seed: int) -> None:
        ask = [{"role": "user", "content": "Tell me a long story about a lighthouse."}]
        client = server.client(timeout=600)  # streams that end early would leave the long prompt nothing to run beside
        client.chat.completions.create(model=MODEL, messages=ask, max_tokens=400, seed=seed, logit_bias=NEVER_END)  # type: ignore[arg-type]

    with ThreadPoolExecutor(max_workers=2) as pool:
        streams = [pool.submit(stream, seed) for seed in range(2)]
        eventually(lambda: engine(server)["lanes"][0]["busy_slots"] == 2 or None, timeout=60)  # both decode
        answer = complete(prompt)
        for done in streams:
            done.result()
    assert answer == alone
    assert engine(server)["pieces_beside"] - before >= 2
