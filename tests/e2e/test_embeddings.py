"""`POST /v1/embeddings` with the official `openai` client: on the embedded engine (the default models), and
through a gateway whose models relay to another tokenrelay and to llama-cpp-python's server.

The engine's vectors are compared for exact equality: an input's vector does not depend on what it was
batched with (see `backends/llamacpp/embedding_context.py`), so a float that differs in its last bit is a bug.
"""

from __future__ import annotations

import base64
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import httpx
import numpy as np
import openai
import pytest
import yaml
from accounting_support import counters, ledger_rows, sqlite_url
from openai import OpenAI
from servers import Server, shared_data_dir, start_server
from third_party_node import start_llama_node, wait_models
from tiny_bert import write_tiny_bert

from tokenrelay.backends.llamacpp.default_model import ensure_default_model

MODEL = "gemma-3-270m"
TEXTS = ["The cat sat on the mat.", "Paris is the capital of France.", "hello", "Embeddings map text to vectors."]
ADMIN = "test-admin-key"
ENGINE = {"slots": 2, "ctx_per_slot": 256, "threads": 1}
# The default engine's context and threads, but a 1024-token input in one decode rather than in 256-token pieces.
WHOLE_DECODES = {"slots": 1, "ctx_per_slot": 1024, "threads": 2, "embedding_decode_tokens": 1024}
LONG_TEXT = "The archive holds letters, maps and ledgers from the old harbour office. " * 40  # ~600 tokens


def vectors(client: OpenAI, texts: Any, model: str = MODEL, **options: Any) -> list[np.ndarray]:
    answer = client.embeddings.create(model=model, input=texts, encoding_format="float", **options)
    assert [item.index for item in answer.data] == list(range(len(answer.data)))
    return [np.asarray(item.embedding, dtype=np.float32) for item in answer.data]


def same(a: np.ndarray, b: np.ndarray) -> bool:
    return a.tobytes() == b.tobytes()


def bad_request(call: Any) -> dict[str, Any]:
    with pytest.raises(openai.BadRequestError) as caught:
        call()
    assert caught.value.status_code == 400
    return caught.value.body


# The embedded engine ----------------------------------------------------------------------------------
def test_a_batch_is_answered_in_input_order_with_the_vectors_each_text_gets_alone(client: OpenAI) -> None:
    alone = [vectors(client, text)[0] for text in TEXTS]
    answer = client.embeddings.create(model=MODEL, input=TEXTS[::-1], encoding_format="float")
    assert answer.object == "list" and answer.model == MODEL
    assert [(item.object, item.index) for item in answer.data] == [("embedding", i) for i in range(len(TEXTS))]
    batch = [np.asarray(item.embedding, dtype=np.float32) for item in answer.data][::-1]
    assert all(same(a, b) for a, b in zip(alone, batch, strict=True))
    assert len({a.tobytes() for a in alone}) == len(TEXTS)
    assert all(abs(float(np.linalg.norm(a.astype(np.float64))) - 1.0) < 1e-6 for a in alone)
    assert answer.usage.prompt_tokens == answer.usage.total_tokens > len(TEXTS)


def test_the_same_text_gets_the_same_vector_under_concurrent_load(client: OpenAI) -> None:
    probe = TEXTS[1]
    reference = vectors(client, probe)[0]
    batches = [[probe], [TEXTS[0], probe], [*TEXTS, probe], [probe, "x " * 40], [TEXTS[3], TEXTS[2], probe]] * 2

    def chat(_: int) -> str:
        messages = [{"role": "user", "content": "Say hi"}]
        reply = client.chat.completions.create(model="smollm2-135m-instruct", messages=messages, max_tokens=8)
        return reply.choices[0].message.content or ""

    with ThreadPoolExecutor(6) as pool:
        generating = [pool.submit(chat, i) for i in range(2)]
        results = list(pool.map(lambda batch: vectors(client, batch), batches))
        assert all(future.result() is not None for future in generating)
    for batch, found in zip(batches, results, strict=True):
        assert same(found[batch.index(probe)], reference)


def test_base64_carries_the_same_floats(client: OpenAI) -> None:
    floats = vectors(client, TEXTS[:2])
    packed = client.embeddings.create(model=MODEL, input=TEXTS[:2], encoding_format="base64")
    for item, expected in zip(packed.data, floats, strict=True):
        assert isinstance(item.embedding, str)
        assert same(np.frombuffer(base64.b64decode(item.embedding), dtype="<f4"), expected)
    # Without `encoding_format` the SDK asks for base64 and decodes it itself.
    decoded = client.embeddings.create(model=MODEL, input=TEXTS[:2])
    assert [np.asarray(item.embedding, dtype=np.float32).tobytes() for item in decoded.data] == [
        f.tobytes() for f in floats
    ]


def test_token_ids_embed_like_the_text_they_spell(server: Server, client: OpenAI) -> None:
    with server.http() as http:
        ids = [
            http.post("/tokenize", json={"model": MODEL, "prompt": text, "add_special": True}).json()["tokens"]
            for text in TEXTS[:2]
        ]
    from_text = vectors(client, TEXTS[:2])
    one = client.embeddings.create(model=MODEL, input=ids[0], encoding_format="float")
    assert same(np.asarray(one.data[0].embedding, dtype=np.float32), from_text[0])
    assert one.usage.prompt_tokens == len(ids[0])
    several = vectors(client, ids)
    assert all(same(a, b) for a, b in zip(several, from_text, strict=True))


def test_the_chat_model_embeds_too(client: OpenAI) -> None:
    found = vectors(client, TEXTS[:2], model="smollm2-135m-instruct")
    assert len(found) == 2 and len(found[0]) == 576  # SmolLM2-135M's hidden size
    assert not same(found[0], found[1])


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"input": []}, "input"),
        ({"input": ""}, "input"),
        ({"input": ["fine", ""]}, "input.1"),  # the offending element
        ({"input": [[1, 2], []]}, "input.1"),
        ({"input": "word " * 2000}, "input"),  # longer than the model's context
        ({"input": [5, 10**6]}, "input"),  # outside the vocabulary
        ({"input": "x", "encoding_format": "hex"}, "encoding_format"),
        ({"input": "x", "dimensions": 8}, "dimensions"),  # the default models are not truncatable
        ({"input": "x", "extra_body": {"dimension": 8}}, "dimension"),  # an unknown field
    ],
)
def test_bad_requests_are_400s_naming_the_field(client: OpenAI, fields: dict[str, Any], param: str) -> None:
    body = bad_request(lambda: client.embeddings.create(model=MODEL, **fields))
    assert body["param"] == param and body["type"] == "invalid_request_error"


def test_the_route_is_in_the_openapi_schema(server: Server) -> None:
    with server.http() as http:
        schema = http.get("/openapi.json").json()
    body = schema["paths"]["/v1/embeddings"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    assert "input" in schema["components"]["schemas"][body["$ref"].rsplit("/", 1)[-1]]["properties"]


# Through a gateway ------------------------------------------------------------------------------------
@dataclass
class Gateway:
    server: Server
    node: Server  # llama-cpp-python's server, embedding with mean pooling
    url: str  # the gateway's database
    key: str
    budget_key: str

    def client(self, key: str | None = None) -> OpenAI:
        return self.server.client(api_key=key or self.key)


def create_key(server: Server, spec: dict[str, Any]) -> str:
    response = httpx.post(
        f"{server.base_url}/admin/keys", json=spec, headers={"Authorization": f"Bearer {ADMIN}"}, timeout=30
    )
    assert response.status_code == 201, response.text
    return response.json()["key"]


@pytest.fixture(scope="module")
def gateway(server: Server, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    tmp = tmp_path_factory.mktemp("embeddings-gateway")
    gguf = ensure_default_model(shared_data_dir())
    node = start_llama_node(tmp, gguf, "gemma-node", "--embedding", "true", "--pooling_type", "1", n_ctx=512)
    started = [node]
    try:
        wait_models(node)
        config = {
            "admin_key": ADMIN,
            "routing": {"health": {"probe_interval": 0}},
            "models": [
                {"id": "no-embeddings", "path": str(gguf), "engine": ENGINE, "embeddings": False},
                {"id": "truncatable", "path": str(gguf), "engine": ENGINE, "embeddings_truncatable": True},
                {"id": "whole-decodes", "path": str(gguf), "engine": WHOLE_DECODES},
                {"id": "via-tokenrelay", "upstreams": [{"url": f"{server.base_url}/v1", "name": "tr", "model": MODEL}]},
                {"id": "via-llama", "upstreams": [{"url": f"{node.base_url}/v1", "name": "ll", "model": "gemma-node"}]},
            ],
        }
        path = tmp / "gateway.yaml"
        path.write_text(yaml.safe_dump(config))
        url = sqlite_url(tmp)
        gw = start_server(tmp, "--config", str(path), "--database-url", url)
        started.append(gw)
        key = create_key(gw, {"name": "emb"})
        budget_key = create_key(gw, {"name": "emb-budget", "budget_tokens": 100})
        yield Gateway(gw, node, url, key, budget_key)
    finally:
        for process in started:
            process.stop()


def test_a_model_with_embeddings_off_is_a_400_naming_model(gateway: Gateway) -> None:
    body = bad_request(lambda: gateway.client().embeddings.create(model="no-embeddings", input="x"))
    assert body["param"] == "model"


def test_a_long_input_embedded_in_pieces_equals_the_same_input_in_one_decode(gateway: Gateway, client: OpenAI) -> None:
    in_pieces = vectors(client, LONG_TEXT)[0]  # the default engine: 256 tokens per decode
    assert same(vectors(client, [TEXTS[0], LONG_TEXT, TEXTS[1]])[1], in_pieces)
    assert same(vectors(gateway.client(), LONG_TEXT, model="whole-decodes")[0], in_pieces)


def test_dimensions_truncates_and_renormalises_on_a_truncatable_model(gateway: Gateway) -> None:
    client = gateway.client()
    full = vectors(client, TEXTS[0], model="truncatable")[0]
    short = vectors(client, TEXTS[0], model="truncatable", dimensions=64)[0]
    assert len(full) == 640 and len(short) == 64
    assert abs(float(np.linalg.norm(short.astype(np.float64))) - 1.0) < 1e-6
    # The same direction as the full vector's first 64 components (float32 rounding apart).
    head = full[:64].astype(np.float64)
    assert np.allclose(short, head / np.linalg.norm(head), atol=1e-6)
    too_many = bad_request(lambda: client.embeddings.create(model="truncatable", input="x", dimensions=641))
    assert too_many["param"] == "dimensions"


def test_a_relay_to_another_tokenrelay_gives_its_vectors_and_usage(gateway: Gateway, client: OpenAI) -> None:
    direct = client.embeddings.create(model=MODEL, input=TEXTS, encoding_format="float")
    relayed = gateway.client().embeddings.create(model="via-tokenrelay", input=TEXTS, encoding_format="float")
    assert relayed.model == "via-tokenrelay"
    assert [item.embedding for item in relayed.data] == [item.embedding for item in direct.data]
    assert relayed.usage.prompt_tokens == direct.usage.prompt_tokens
    packed = gateway.client().embeddings.create(model="via-tokenrelay", input=TEXTS[0], encoding_format="base64")
    assert isinstance(packed.data[0].embedding, str)
    assert np.frombuffer(base64.b64decode(packed.data[0].embedding), dtype="<f4").tolist() == direct.data[0].embedding


def test_a_relay_to_llama_cpp_python_gives_its_vectors_and_usage(gateway: Gateway) -> None:
    direct = httpx.post(
        f"{gateway.node.base_url}/v1/embeddings", json={"model": "gemma-node", "input": TEXTS[:3]}, timeout=60
    ).json()
    relayed = gateway.client().embeddings.create(model="via-llama", input=TEXTS[:3], encoding_format="float")
    assert relayed.model == "via-llama" and len(relayed.data) == 3
    for item, node_item in zip(relayed.data, sorted(direct["data"], key=lambda d: d["index"]), strict=True):
        assert same(np.asarray(item.embedding, np.float32), np.asarray(node_item["embedding"], np.float32))
    assert relayed.usage.prompt_tokens == direct["usage"]["prompt_tokens"]


def test_ledger_rows_and_budgets_count_embedding_tokens(gateway: Gateway) -> None:
    client = gateway.client(gateway.budget_key)
    served = [client.embeddings.create(model="via-tokenrelay", input=TEXTS[:2]) for _ in range(2)]
    with pytest.raises(openai.BadRequestError):
        client.embeddings.create(model="no-embeddings", input="x")
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        rows = [r for r in ledger_rows(gateway.url) if r["key_name"] == "emb-budget"]
        if len(rows) == 3:
            break
        time.sleep(0.2)
    assert [r["endpoint"] for r in rows] == ["embeddings"] * 3
    assert [(r["model"], r["status"]) for r in rows] == [("via-tokenrelay", 200)] * 2 + [("no-embeddings", 400)]
    assert [r["prompt_tokens"] for r in rows[:2]] == [s.usage.prompt_tokens for s in served]
    assert all(r["completion_tokens"] == 0 for r in rows)
    used = sum(s.usage.prompt_tokens for s in served)
    state = counters(gateway.url, "emb-budget")
    assert state["budget_used"] == used and state["budget_reserved"] == 0
    metrics = httpx.get(f"{gateway.server.base_url}/metrics", timeout=10).text
    assert 'endpoint="embeddings"' in metrics and 'model="via-tokenrelay"' in metrics
    # A request whose worst case no longer fits the budget is refused before it runs.
    with pytest.raises(openai.RateLimitError):
        client.embeddings.create(model="via-tokenrelay", input="word " * 30)


# An encoder embedding model ---------------------------------------------------------------------------
@pytest.fixture(scope="module")
def bert(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    tmp = tmp_path_factory.mktemp("tiny-bert")
    gguf = write_tiny_bert(tmp / "tiny-bert.gguf")
    server = start_server(tmp, "--model", str(gguf), "--model-id", "tiny-bert", "--threads", "1")
    yield server
    server.stop()


def test_an_encoder_model_embeds_with_its_declared_pooling_and_refuses_generation(bert: Server) -> None:
    client = bert.client()
    alone = [vectors(client, text, model="tiny-bert")[0] for text in TEXTS]
    batch = vectors(client, TEXTS, model="tiny-bert")
    assert all(len(v) == 64 and abs(float(np.linalg.norm(v.astype(np.float64))) - 1.0) < 1e-6 for v in alone)
    # llama.cpp pools this model itself (it declares mean pooling): a matrix product over the whole batch, and
    # the encoder's attention softmax runs over every input's tokens (masked), so a vector may differ from the
    # input's vector alone in the last bits of its floats.
    assert all(np.allclose(a, b, rtol=0, atol=1e-6) for a, b in zip(alone, batch, strict=True))
    assert len({v.tobytes() for v in alone}) == len(TEXTS)
    health = httpx.get(f"{bert.base_url}/health", timeout=10).json()["models"]["tiny-bert"]
    assert (health["embeddings"], health["embedding_pooling"]) == (True, "mean")
    body = bad_request(
        lambda: client.chat.completions.create(model="tiny-bert", messages=[{"role": "user", "content": "hi"}])
    )
    assert body["param"] == "model"
