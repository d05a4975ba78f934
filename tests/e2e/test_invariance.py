"""Batch invariance: a greedy or seeded request gets the same tokens alone and beside any mix of other requests.

The default server (16 slots per model) is driven with the official client: each request is sent once alone,
then again among others at once; the texts must be equal. Prompts differ in length (a few tokens to past the
256 cache cells where llama.cpp's attention changes kernels), so the same run covers prefix-cache misses (the
first, lone runs) and hits (the repeats).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from helpers import MODEL, user
from openai import OpenAI

CHAT_MODEL = "smollm2-135m-instruct"
FILLER = "The archive holds letters, maps and ledgers from the old harbour office. "


def prompt(i: int) -> str:
    """Sixteen prompts of different lengths: every fourth one runs past 256 tokens."""
    return FILLER * (24 if i % 4 == 3 else i % 4 * 3) + f"Fact number {i}:"


def complete(client: OpenAI, **kwargs: Any) -> list[str]:
    reply = client.completions.create(model=MODEL, **({"max_tokens": 8} | kwargs))
    return [choice.text for choice in sorted(reply.choices, key=lambda c: c.index)]


def alone_and_together(calls: list[Callable[[], Any]]) -> tuple[list[Any], list[Any]]:
    alone = [call() for call in calls]
    with ThreadPoolExecutor(len(calls)) as pool:
        together = list(pool.map(lambda call: call(), calls))
    return alone, together


def test_sixteen_greedy_completions_of_different_lengths_match_the_same_requests_alone(client: OpenAI) -> None:
    calls = [lambda i=i: complete(client, prompt=prompt(i), temperature=0) for i in range(16)]
    alone, together = alone_and_together(calls)
    assert together == alone


def test_sixteen_seeded_sampled_completions_match_the_same_requests_alone(client: OpenAI) -> None:
    calls = [
        lambda i=i: complete(client, prompt=prompt(i), temperature=0.9, top_p=0.95, seed=7000 + i) for i in range(16)
    ]
    alone, together = alone_and_together(calls)
    assert together == alone


def test_a_long_prompt_evaluated_in_the_middle_of_decoding_changes_nothing(client: OpenAI) -> None:
    """Eight streams decode while a 900-token prompt is evaluated piece by piece beside them."""
    calls = [lambda i=i: complete(client, prompt=prompt(i), temperature=0, max_tokens=24) for i in range(8)]
    alone = [call() for call in calls]
    started = threading.Event()

    def long_one() -> None:
        started.wait(30)
        time.sleep(0.3)  # the short ones are decoding by now
        client.completions.create(model=MODEL, prompt=FILLER * 60, max_tokens=4, temperature=0)

    with ThreadPoolExecutor(9) as pool:
        long_done = pool.submit(long_one)
        futures = [pool.submit(call) for call in calls]
        started.set()
        together = [f.result() for f in futures]
        long_done.result()
    assert together == alone


def chat(client: OpenAI, model: str, question: str, **kwargs: Any) -> list[str | None]:
    reply = client.chat.completions.create(model=model, messages=user(question), max_tokens=10, **kwargs)
    return [choice.message.content for choice in sorted(reply.choices, key=lambda c: c.index)]


def test_chat_siblings_and_constrained_requests_match_the_same_requests_alone(client: OpenAI) -> None:
    questions = [f"Tell me one thing about {w}." for w in ("owls", "rivers", "glass", "clocks")]
    calls: list[Callable[[], Any]] = [lambda q=q: chat(client, CHAT_MODEL, q, temperature=0) for q in questions]
    calls += [lambda q=q: chat(client, CHAT_MODEL, q, temperature=1.0, seed=11, n=3) for q in questions[:2]]
    calls += [lambda q=q: chat(client, MODEL, q, temperature=0.8, seed=5) for q in questions[2:]]
    json_format = {"type": "json_object"}
    calls += [lambda q=q: chat(client, CHAT_MODEL, q, temperature=0, response_format=json_format) for q in questions]
    calls += [lambda: complete(client, prompt=prompt(3), temperature=0.7, seed=3, n=2, best_of=3)]
    alone, together = alone_and_together(calls)
    assert together == alone


def test_a_prompt_continuing_an_earlier_answer_reuses_its_cache_and_equals_a_fresh_evaluation(client: OpenAI) -> None:
    """The cells a slot keeps of an earlier prompt are reused, exactly: the continuation equals the same prompt
    evaluated from scratch. (Some of it is read again: prompt pieces and decoding steps compute a token's cells
    with kernels of their own, and a cell is reused where the new prompt would compute it with the same kernel.
    Prompt logprobs need every position, so an `echo` with `logprobs` reuses nothing.)"""
    first = client.completions.create(model=MODEL, prompt=prompt(3), max_tokens=12, temperature=0)
    follow = prompt(3) + first.choices[0].text + " Then"
    reused = client.completions.create(model=MODEL, prompt=follow, max_tokens=8, temperature=0)
    assert reused.usage.prompt_tokens_details.cached_tokens >= first.usage.prompt_tokens // 2
    fresh = client.completions.create(model=MODEL, prompt=follow, max_tokens=8, temperature=0, echo=True, logprobs=0)
    assert fresh.usage.prompt_tokens_details.cached_tokens == 0
    assert fresh.choices[0].text == follow + reused.choices[0].text
