"""The Responses API in front of nodes that speak chat: another tokenrelay, and llama-cpp-python's own server.

The gateway translates to chat for the node and the node's answer back into a response, streamed or not.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import openai
import pytest
import yaml
from accounting_support import sqlite_url
from servers import Server, shared_data_dir, start_server, wait_ready
from third_party_node import start_llama_node, wait_models

from tokenrelay.backends.llamacpp.default_model import smollm2_path

CHAT_MODEL = "smollm2-135m-instruct"
MODELS = ["via-tokenrelay", "via-llama"]


@dataclass
class Relay:
    gateway: Server

    def client(self) -> openai.OpenAI:
        return self.gateway.client()


@pytest.fixture(scope="module")
def relay(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Relay]:
    tmp = tmp_path_factory.mktemp("responses-relay")
    node = start_server(tmp, "--slots", "2", "--threads", "1", wait=False)
    llama = start_llama_node(tmp, smollm2_path(shared_data_dir()), "smol-node")
    started = [node, llama]
    try:
        wait_ready(node)
        wait_models(llama)
        config = {
            "routing": {"health": {"probe_interval": 0}},
            "models": [
                {"id": "via-tokenrelay", "upstreams": [{"url": f"{node.base_url}/v1", "model": CHAT_MODEL}]},
                {"id": "via-llama", "upstreams": [{"url": f"{llama.base_url}/v1", "model": "smol-node"}]},
            ],
        }
        path = tmp / "gateway.yaml"
        path.write_text(yaml.safe_dump(config))
        gateway = start_server(tmp, "--config", str(path), "--database-url", sqlite_url(tmp))
        started.append(gateway)
        yield Relay(gateway)
    finally:
        for server in started:
            server.stop()


def body(model: str, **extra: Any) -> dict[str, Any]:
    return {"model": model, "input": "Say hello to Ada.", "instructions": "Be brief.", "temperature": 0} | {
        "max_output_tokens": 12,
        **extra,
    }


@pytest.mark.parametrize("model", MODELS)
def test_a_node_that_speaks_chat_answers_a_response(relay: Relay, model: str) -> None:
    client = relay.client()
    response = client.responses.create(**body(model))
    assert response.object == "response" and response.model == model and response.output_text.strip()
    assert response.status in ("completed", "incomplete") and response.output[0].id.startswith("msg_")
    assert response.usage is not None and response.usage.input_tokens > 0 and response.usage.output_tokens > 0
    # Stored at the gateway, so a continuation works whatever the node keeps.
    follow = client.responses.create(**body(model, input="And to Bob?", previous_response_id=response.id))
    assert follow.previous_response_id == response.id and follow.output_text.strip()


@pytest.mark.parametrize("model", MODELS)
def test_a_node_that_speaks_chat_streams_a_response(relay: Relay, model: str) -> None:
    client = relay.client()
    plain = client.responses.create(**body(model))
    with client.responses.stream(**body(model)) as stream:
        events = list(stream)
    kinds = [event.type for event in events]
    assert kinds[:2] == ["response.created", "response.in_progress"] and kinds[-1] == f"response.{plain.status}"
    deltas = "".join(event.delta for event in events if event.type == "response.output_text.delta")
    assert deltas == events[-1].response.output_text == plain.output_text
    assert [event.sequence_number for event in events] == list(range(len(events)))


LONG = "Write a long story about a dragon who learns to bake bread."


@pytest.mark.parametrize("stream", [False, True])
def test_max_output_tokens_holds_on_a_node_that_reads_only_max_tokens(relay: Relay, stream: bool) -> None:
    # llama-cpp-python's server reads `max_tokens` alone; the gateway sends that and enforces the limit itself.
    request = body("via-llama", input=LONG, max_output_tokens=16)
    if stream:
        with relay.client().responses.stream(**request) as events:
            response = list(events)[-1].response  # type: ignore[union-attr]
    else:
        response = relay.client().responses.create(**request)
    assert response.usage is not None and 0 < response.usage.output_tokens <= 16
    assert response.status == "incomplete" and response.incomplete_details is not None
    assert response.incomplete_details.reason == "max_output_tokens"


@pytest.mark.parametrize("stream", [False, True])
def test_chat_max_completion_tokens_holds_on_that_node(relay: Relay, stream: bool) -> None:
    request: dict[str, Any] = {
        "model": "via-llama",
        "messages": [{"role": "user", "content": LONG}],
        "max_completion_tokens": 8,
        "temperature": 0,
    }
    client = relay.client()
    if not stream:
        reply = client.chat.completions.create(**request)
        assert reply.choices[0].finish_reason == "length"
        assert reply.usage is not None and 0 < reply.usage.completion_tokens <= 8
        return
    chunks = list(client.chat.completions.create(**request, stream=True, stream_options={"include_usage": True}))
    texts = [c.choices[0].delta.content for c in chunks if c.choices and c.choices[0].delta.content]
    assert 0 < len(texts) <= 8
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == ["length"]
    assert chunks[-1].usage is not None and 0 < chunks[-1].usage.completion_tokens <= 8
