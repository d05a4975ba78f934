"""`/v1/messages` on a gateway whose model is served by a node: another tokenrelay, and llama-cpp-python's own
server. The gateway translates to chat completions, the node answers chat, the gateway translates back."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import anthropic
import pytest
import yaml
from accounting_support import sqlite_url
from servers import Server, start_server, wait_ready
from third_party_node import start_llama_node, wait_models

from tokenrelay.backends.llamacpp.default_model import smollm2_path

CHAT_MODEL = "smollm2-135m-instruct"
ASK = [{"role": "user", "content": "Name three colours."}]
GREEDY = {"temperature": 0}


@dataclass
class Relays:
    gateway: Server

    def client(self) -> anthropic.Anthropic:
        return anthropic.Anthropic(base_url=self.gateway.base_url, api_key="none", max_retries=0)


@pytest.fixture(scope="module")
def relays(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Relays]:
    tmp = tmp_path_factory.mktemp("messages-relay")
    node = start_server(tmp, "--slots", "1", "--threads", "1", wait=False)
    llama = start_llama_node(tmp, smollm2_path(tmp), "smollm2-node")
    started = [node, llama]
    try:
        wait_ready(node)
        wait_models(llama)
        config = {
            "models": [
                {
                    "id": "via-tokenrelay",
                    "upstreams": [{"url": f"{node.base_url}/v1", "name": "tr", "model": CHAT_MODEL}],
                },
                {
                    "id": "via-llama",
                    "upstreams": [{"url": f"{llama.base_url}/v1", "name": "lc", "model": "smollm2-node"}],
                },
            ],
            "routing": {"health": {"probe_interval": 0}},
        }
        path = tmp / "gateway.yaml"
        path.write_text(yaml.safe_dump(config))
        gateway = start_server(tmp, "--config", str(path), "--database-url", sqlite_url(tmp))
        started.append(gateway)
        yield Relays(gateway)
    finally:
        for server in started:
            server.stop()


def text_of(message: Any) -> str:
    return "".join(block.text for block in message.content if block.type == "text")


@pytest.mark.parametrize("model", ["via-tokenrelay", "via-llama"])
def test_a_relayed_message(relays: Relays, model: str) -> None:
    reply = relays.client().messages.create(model=model, max_tokens=12, messages=ASK, extra_body=GREEDY)
    assert reply.model == model and reply.id.startswith("msg_")
    assert text_of(reply) and reply.stop_reason in ("end_turn", "max_tokens")
    assert 1 <= reply.usage.output_tokens <= 12
    assert reply.usage.input_tokens + reply.usage.cache_read_input_tokens > 0


@pytest.mark.parametrize("model", ["via-tokenrelay", "via-llama"])
def test_a_relayed_stream_assembles_the_relayed_message(relays: Relays, model: str) -> None:
    client = relays.client()
    body: dict[str, Any] = {"model": model, "max_tokens": 12, "messages": ASK, "extra_body": GREEDY}
    whole = client.messages.create(**body)
    with client.messages.stream(**body) as stream:
        deltas = list(stream.text_stream)
        final = stream.get_final_message()
    assert len(deltas) > 1
    assert "".join(deltas) == text_of(final) == text_of(whole)
    assert final.stop_reason == whole.stop_reason
    if model == "via-tokenrelay":
        assert final.usage.output_tokens == whole.usage.output_tokens
    else:  # llama-cpp-python reports no usage in a stream: the gateway's estimate stands in
        assert final.usage.output_tokens > 0


def test_a_tokenrelay_node_says_which_stop_sequence_matched(relays: Relays) -> None:
    client = relays.client()
    body: dict[str, Any] = {"model": "via-tokenrelay", "max_tokens": 12, "messages": ASK, "extra_body": GREEDY}
    full = text_of(client.messages.create(**body))
    stop = full.split()[1]
    reply = client.messages.create(**body, stop_sequences=["never-in-the-text", stop])
    assert (reply.stop_reason, reply.stop_sequence) == ("stop_sequence", stop)
    assert text_of(reply) == full[: full.index(stop)]


def test_count_tokens_of_a_node_only_model_is_an_estimate(relays: Relays) -> None:
    counted = relays.client().messages.count_tokens(model="via-llama", messages=ASK)
    assert counted.input_tokens > 0


@pytest.mark.parametrize("stream", [False, True])
def test_max_tokens_holds_on_a_node_that_reads_only_max_tokens(relays: Relays, stream: bool) -> None:
    ask = [{"role": "user", "content": "Write a long story about a dragon who learns to bake bread."}]
    body: dict[str, Any] = {"model": "via-llama", "max_tokens": 8, "messages": ask, "extra_body": GREEDY}
    if stream:
        with relays.client().messages.stream(**body) as events:
            reply = events.get_final_message()
    else:
        reply = relays.client().messages.create(**body)
    assert reply.stop_reason == "max_tokens" and 0 < reply.usage.output_tokens <= 8


CONVERSATION = [
    {"role": "user", "content": "Name three colours."},
    {"role": "assistant", "content": "Red, green and blue."},
    {"role": "user", "content": "And three fruits?"},
]
WEATHER = {
    "name": "get_weather",
    "description": "The weather in a city.",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}


@pytest.mark.parametrize("tools", [[], [WEATHER]], ids=["plain", "tool"])
def test_count_tokens_is_the_nodes_own_count_through_its_tokenizer(relays: Relays, tools: list[Any]) -> None:
    body: dict[str, Any] = {"model": "via-tokenrelay", "messages": CONVERSATION, "system": "Be brief."}
    if tools:
        body["tools"] = tools
    counted = relays.client().messages.count_tokens(**body)
    reply = relays.client().messages.create(**body, max_tokens=1, extra_body=GREEDY)
    assert counted.input_tokens == reply.usage.input_tokens + (reply.usage.cache_read_input_tokens or 0)


def test_count_tokens_without_a_tokenizer_endpoint_is_an_estimate_within_its_bound(relays: Relays) -> None:
    # llama-cpp-python's server has no chat tokenizer endpoint: the README states how far the estimate may be off
    # once the node has answered a request through the gateway (which shows what its template adds).
    client = relays.client()
    client.messages.create(model="via-llama", messages=ASK, max_tokens=1)
    bread = [{"role": "user", "content": "Describe, in a few sentences, how bread is made."}]
    for messages in (ASK, CONVERSATION, bread):
        counted = client.messages.count_tokens(model="via-llama", messages=messages).input_tokens
        used = client.messages.create(model="via-llama", messages=messages, max_tokens=1).usage
        actual = used.input_tokens + (used.cache_read_input_tokens or 0)
        assert abs(counted - actual) <= max(5, actual * 0.12), (counted, actual)
