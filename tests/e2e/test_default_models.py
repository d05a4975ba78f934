"""The default server: two models from PyPI packages, a chat model that follows its template, no idle CPU."""

from __future__ import annotations

import os
import time
from pathlib import Path

import httpx
from helpers import MODEL
from openai import OpenAI
from servers import Server

CHAT_MODEL = "smollm2-135m-instruct"
RENDERED = "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nSay hello.<|im_end|>\n<|im_start|>assistant\n"
CONVERSATION = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Say hello."}]


def test_both_default_models_are_listed_and_served(server: Server, client: OpenAI) -> None:
    assert {m.id for m in client.models.list()} == {MODEL, CHAT_MODEL}
    health = httpx.get(f"{server.base_url}/health", timeout=10).json()["models"]
    assert health[MODEL]["ready"] and health[CHAT_MODEL]["ready"]
    for model in (MODEL, CHAT_MODEL):
        reply = client.completions.create(model=model, prompt="One, two,", max_tokens=2, temperature=0, echo=True)
        assert reply.choices[0].text.startswith("One, two,") and reply.usage.completion_tokens <= 2


def test_the_chat_model_renders_its_chatml_template(server: Server, client: OpenAI) -> None:
    """The chat prompt is the GGUF's ChatML template filled in: the same tokens, and greedily the same answer, as
    a completion of the rendered text."""
    with server.http() as http:
        tokens = http.post("/tokenize", json={"model": CHAT_MODEL, "prompt": RENDERED}).json()["tokens"]
    chat = client.chat.completions.create(model=CHAT_MODEL, messages=CONVERSATION, max_tokens=12, temperature=0)
    assert chat.usage.prompt_tokens == len(tokens)
    plain = client.completions.create(model=CHAT_MODEL, prompt=tokens, max_tokens=12, temperature=0)
    assert plain.choices[0].text == chat.choices[0].message.content


def test_a_reply_ends_at_the_end_of_turn_token_with_finish_reason_stop(client: OpenAI) -> None:
    chat = client.chat.completions.create(model=CHAT_MODEL, messages=CONVERSATION, max_tokens=200, temperature=0)
    choice = chat.choices[0]
    assert choice.finish_reason == "stop" and chat.usage.completion_tokens < 200
    assert "<|im_end|>" not in choice.message.content and choice.message.content.strip()
    # The stop came from the model's end-of-turn token: banning it lets the same reply run on past that point.
    with httpx.Client(base_url=str(client.base_url), timeout=120) as http:
        end = http.post("../tokenize", json={"model": CHAT_MODEL, "prompt": "<|im_end|>"}).json()["tokens"]
    longer = client.chat.completions.create(
        model=CHAT_MODEL,
        messages=CONVERSATION,
        max_tokens=chat.usage.completion_tokens + 4,
        temperature=0,
        logit_bias={str(t): -100 for t in end},
    )
    assert longer.choices[0].message.content.startswith(choice.message.content)
    assert longer.usage.completion_tokens > chat.usage.completion_tokens


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def test_idle_models_cost_no_cpu(server: Server, client: OpenAI) -> None:
    """Once requests are done, neither model's scheduler nor llama.cpp's threads keep spinning."""
    client.completions.create(model=MODEL, prompt="Hi", max_tokens=2)
    client.completions.create(model=CHAT_MODEL, prompt="Hi", max_tokens=2)
    time.sleep(1.0)  # llama.cpp's worker threads spin briefly after a step before they sleep
    before = cpu_seconds(server.process.pid)
    time.sleep(3.0)
    assert cpu_seconds(server.process.pid) - before < 0.15  # under 5% of one core
