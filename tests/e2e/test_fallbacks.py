"""Fallback models on a real server: a model whose only node is dead, one whose node answers 429 and one whose
context is too short for a prompt are served by their fallbacks; the answer and its ledger row say which model
served (priced at that model); a key that may not use a fallback does not get it; a stream that broke after its
first byte does not fall back."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import pytest
import yaml
from accounting_support import create_key, ledger_row, sqlite_url
from loopback_node import LoopbackNode, loopback_node
from servers import ROOT, Server, free_port, server_env, shared_data_dir, start_server
from upstream_faultnode import FaultNode, fault_node

from tokenrelay.backends.llamacpp.default_model import smollm2_path

ENGINE = "smollm2-135m-instruct"  # the embedded default chat model
SERVED = "x-tokenrelay-served-model"
# Per million tokens. The loopback node reports 4 prompt tokens and max_tokens completion tokens.
DEAD_PRICES = {"input": "1000", "output": "1000"}
BACKUP_PRICES = {"input": "3", "output": "5"}
LONG_PROMPT = "Tell me everything about the colours of the rainbow, one by one. " * 25  # over 256 tokens
NARROW = 256  # the context of `narrow`, whose prompts are evaluated in chunks that fit it


@dataclass
class Gateway:
    server: Server
    database: str
    keys: dict[str, str]
    backup: LoopbackNode
    fault: FaultNode  # answers 429
    breaking: FaultNode  # cuts its streams off

    def openai(self, key: str = "full") -> openai.OpenAI:
        return self.server.client(api_key=self.keys[key])


def gateway_config(backup: LoopbackNode, fault: FaultNode, breaking: FaultNode) -> dict[str, Any]:
    dead = {"url": f"http://127.0.0.1:{free_port()}/v1", "name": "dead"}  # nothing listens there
    narrow = {"slots": 1, "ctx_per_slot": NARROW, "prefill_chunk": 64, "threads": 1, "long_slots": 0}
    smollm2 = str(smollm2_path(shared_data_dir()))
    return {
        "routing": {"health": {"probe_interval": 0}},
        "models": [
            {"id": "dead", "upstreams": [dead], "fallbacks": ["backup"], "pricing": DEAD_PRICES},
            {"id": "backup", "upstreams": [{"url": backup.url, "name": "backup"}], "pricing": BACKUP_PRICES},
            {"id": "limited", "upstreams": [{"url": fault.url, "name": "limited"}], "fallbacks": [ENGINE]},
            {"id": "narrow", "path": smollm2, "engine": narrow, "context_fallbacks": [ENGINE]},
            {"id": "breaking", "upstreams": [{"url": breaking.url, "name": "breaking"}], "fallbacks": ["backup"]},
            {"id": ENGINE, "engine": {"slots": 2, "threads": 1, "long_slots": 0}},
        ],
    }


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    tmp = tmp_path_factory.mktemp("fallbacks")
    with loopback_node() as backup, fault_node() as fault, fault_node() as breaking:
        fault.status, breaking.cut = 429, True
        config = tmp / "gateway.yaml"
        config.write_text(yaml.safe_dump(gateway_config(backup, fault, breaking)))
        database = sqlite_url(tmp)
        keys = {"full": create_key(database, "full")}
        keys["dead-only"] = create_key(database, "dead-only", "--models", "dead")
        server = start_server(tmp, "--config", str(config), "--database-url", database)
        try:
            yield Gateway(server, database, keys, backup, fault, breaking)
        finally:
            server.stop()


def ask(model: str, content: str = "Name a colour.", **extra: Any) -> dict[str, Any]:
    return {"model": model, "messages": [{"role": "user", "content": content}], "max_tokens": 3, **extra}


def test_a_model_whose_node_is_dead_is_served_by_its_fallback_and_priced_as_it(gateway: Gateway) -> None:
    raw = gateway.openai().chat.completions.with_raw_response.create(**ask("dead"))
    completion = raw.parse()
    assert completion.choices[0].message.content == "word " * 3  # the backup node's answer
    assert completion.model == raw.headers[SERVED] == "backup"
    row = ledger_row(gateway.database, raw.headers["x-request-id"])
    assert (row["model"], row["served_model"], row["status"]) == ("dead", "backup", 200)
    assert (row["prompt_tokens"], row["completion_tokens"]) == (4, 3)
    assert row["priced"] and row["cost"] == 4 * 3 + 3 * 5  # micro-units at the backup's prices, not the dead's


def test_a_stream_names_its_fallback_in_every_chunk(gateway: Gateway) -> None:
    client = gateway.openai()
    with client.chat.completions.with_streaming_response.create(**ask("dead", stream=True)) as response:
        assert response.headers[SERVED] == "backup"
        chunks = list(response.parse())
    assert chunks and {chunk.model for chunk in chunks} == {"backup"}
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "w0 w1 w2 "


def test_once_the_dead_nodes_breaker_is_open_the_fallback_still_serves(gateway: Gateway) -> None:
    client = gateway.openai()
    for _ in range(6):  # five failures open the breaker; then the model has no member to try at all
        assert client.chat.completions.create(**ask("dead")).model == "backup"
    health = httpx.get(f"{gateway.server.base_url}/health", timeout=10).json()["models"]["dead"]
    assert [node["breaker"] for node in health["nodes"]] == ["open"]


def test_a_node_answering_429_falls_back_to_the_embedded_engine(gateway: Gateway) -> None:
    before = gateway.fault.generations
    raw = gateway.openai().chat.completions.with_raw_response.create(**ask("limited"))
    completion = raw.parse()
    assert gateway.fault.generations > before  # the node was asked, and said 429
    assert completion.model == raw.headers[SERVED] == ENGINE
    assert completion.usage is not None and 1 <= completion.usage.completion_tokens <= 3
    row = ledger_row(gateway.database, raw.headers["x-request-id"])
    assert (row["model"], row["served_model"], row["backend"]) == ("limited", ENGINE, "llama.cpp")
    assert (row["priced"], row["cost"]) == (False, 0)  # the engine has no prices


def test_other_apis_name_the_fallback_too(gateway: Gateway) -> None:
    messages = anthropic.Anthropic(base_url=gateway.server.base_url, api_key=gateway.keys["full"], max_retries=0)
    raw = messages.messages.with_raw_response.create(
        model="limited", max_tokens=3, messages=[{"role": "user", "content": "Name a colour."}]
    )
    assert raw.parse().model == raw.headers[SERVED] == ENGINE
    response = gateway.openai().responses.with_raw_response.create(model="dead", input="Hi", max_output_tokens=3)
    assert response.parse().model == response.headers[SERVED] == "backup"


def test_an_over_long_prompt_goes_to_the_context_fallback(gateway: Gateway) -> None:
    client = gateway.openai()
    short = client.chat.completions.with_raw_response.create(**ask("narrow"))
    assert short.parse().model == short.headers[SERVED] == "narrow"  # it fits: the model serves it itself
    assert ledger_row(gateway.database, short.headers["x-request-id"])["served_model"] is None
    long = client.chat.completions.with_raw_response.create(**ask("narrow", LONG_PROMPT))
    completion = long.parse()
    assert completion.model == long.headers[SERVED] == ENGINE
    assert completion.usage is not None and completion.usage.prompt_tokens > NARROW
    row = ledger_row(gateway.database, long.headers["x-request-id"])
    assert (row["model"], row["served_model"]) == ("narrow", ENGINE)
    assert row["prompt_tokens"] == completion.usage.prompt_tokens


def test_an_over_long_prompt_without_a_context_fallback_is_a_400(gateway: Gateway) -> None:
    with pytest.raises(openai.BadRequestError) as refused:
        gateway.openai().chat.completions.create(**ask(ENGINE, LONG_PROMPT * 4))
    assert refused.value.code == "context_length_exceeded"


def test_a_key_that_may_not_use_the_fallback_gets_the_models_own_error(gateway: Gateway) -> None:
    answered = gateway.backup.answered
    with pytest.raises(openai.APIStatusError) as refused:
        gateway.openai("dead-only").chat.completions.create(**ask("dead"))
    assert refused.value.status_code in (502, 503)  # the dead node's failure, or its open breaker
    assert gateway.backup.answered == answered


def test_a_stream_that_breaks_after_its_first_byte_does_not_fall_back(gateway: Gateway) -> None:
    answered, streams = gateway.backup.answered, gateway.breaking.generations
    client = gateway.openai()
    received: list[str] = []
    with client.chat.completions.with_streaming_response.create(**ask("breaking", stream=True)) as response:
        request_id = response.headers["x-request-id"]
        assert response.headers[SERVED] == "breaking"
        with pytest.raises(openai.APIError, match="failed while streaming"):
            for chunk in response.parse():
                received.extend(c.delta.content for c in chunk.choices if c.delta.content)
    assert received == ["half"]
    assert gateway.breaking.generations == streams + 1 and gateway.backup.answered == answered
    row = ledger_row(gateway.database, request_id)
    assert (row["model"], row["served_model"], row["status"]) == ("breaking", None, 502)


def test_fallbacks_are_counted_by_model_pair(gateway: Gateway) -> None:
    gateway.openai().chat.completions.create(**ask("dead"))
    metrics = httpx.get(f"{gateway.server.base_url}/metrics", timeout=10).text
    counts = {
        line.split("{")[1].split("}")[0]: float(line.rsplit(" ", 1)[1])
        for line in metrics.splitlines()
        if line.startswith("tokenrelay_fallbacks_total{")
    }
    assert counts['model="dead",served_model="backup"'] >= 1
    assert counts['model="limited",served_model="smollm2-135m-instruct"'] >= 1
    assert not any('served_model="breaking"' in labels or 'model="breaking"' in labels for labels in counts)


def test_serve_refuses_a_fallback_cycle_in_one_line(tmp_path: Path) -> None:
    node = [{"url": "http://127.0.0.1:1/v1"}]
    models = [{"id": "a", "upstreams": node, "fallbacks": ["b"]}, {"id": "b", "upstreams": node, "fallbacks": ["a"]}]
    config = tmp_path / "cycle.yaml"
    config.write_text(yaml.safe_dump({"models": models}))
    command = [sys.executable, "-m", "tokenrelay", "serve", "--config", str(config), "--data-dir", str(tmp_path)]
    result = subprocess.run(command, capture_output=True, text=True, env=server_env(), cwd=ROOT, timeout=60)
    assert result.returncode == 2
    assert result.stderr == "tokenrelay: invalid settings: fallbacks form a cycle: a -> b -> a\n"
