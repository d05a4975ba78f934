"""Embeddings through nodes: the body a node receives, its answer read back, failover as for chat."""

from __future__ import annotations

import base64
import json
from typing import Any

import numpy as np
import pytest
from aiohttp import web
from upstream_fakes import REFUSE, FakeNodes, answer, error, nodes_fixture

from tokenrelay.backends.base import Ticket
from tokenrelay.backends.tokens import ApproxCounter
from tokenrelay.backends.upstream.embeddings import embedding_body, embeddings_of
from tokenrelay.backends.upstream.failures import NodeFailure
from tokenrelay.errors import APIError, UpstreamError
from tokenrelay.protocol.embeddings import EmbeddingRequest

nodes = nodes_fixture()


def request(value: Any = ("a", "b"), **fields: Any) -> EmbeddingRequest:
    body = {"model": "m", "input": list(value) if isinstance(value, tuple) else value, **fields}
    return EmbeddingRequest.model_validate_json(json.dumps(body), strict=True)


def node_answer(vectors: list[list[float]], prompt_tokens: int | None = 5, order: list[int] | None = None) -> dict:
    order = order if order is not None else list(range(len(vectors)))
    data = [{"object": "embedding", "index": i, "embedding": vectors[i]} for i in order]
    body: dict[str, Any] = {"object": "list", "data": data, "model": "node-model"}
    if prompt_tokens is not None:
        body["usage"] = {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens}
    return body


def test_the_node_gets_the_input_as_sent_under_its_own_model_name() -> None:
    body = embedding_body(request([[1, 2], [3]], encoding_format="base64", dimensions=2, user="u"), "node-model")
    assert body == {"model": "node-model", "input": [[1, 2], [3]], "user": "u"}


def test_an_answer_is_put_in_input_order_with_the_nodes_usage() -> None:
    result = embeddings_of(node_answer([[1.0, 0.0], [0.0, 1.0]], order=[1, 0]), request(), ApproxCounter())
    assert [v.tolist() for v in result.vectors] == [[1.0, 0.0], [0.0, 1.0]]
    assert (result.prompt_tokens, result.estimated) == (5, False)


def test_base64_from_a_node_is_read_as_float32() -> None:
    packed = base64.b64encode(np.array([0.5, -0.25], dtype="<f4").tobytes()).decode()
    body = {"data": [{"index": 0, "embedding": packed}], "usage": {"prompt_tokens": 1}}
    assert embeddings_of(body, request("a"), ApproxCounter()).vectors[0].tolist() == [0.5, -0.25]


def test_usage_is_estimated_when_the_node_gives_none() -> None:
    counter = ApproxCounter()
    texts = embeddings_of(node_answer([[1.0], [1.0]], prompt_tokens=None), request(("abcdefgh", "abcd")), counter)
    assert texts.estimated and texts.prompt_tokens == 2 + 1  # about four bytes a token
    ids = embeddings_of(node_answer([[1.0], [1.0]], prompt_tokens=None), request([[1, 2, 3], [4]]), counter)
    assert ids.estimated and ids.prompt_tokens == 3 + 1  # token ids count exactly


@pytest.mark.parametrize(
    "body",
    [
        {"data": [{"index": 0, "embedding": [1.0]}]},  # one short
        {"data": [{"index": 0, "embedding": [1.0]}, {"index": 0, "embedding": [1.0]}]},  # repeated
        {"data": [{"index": 0, "embedding": "not base64!"}, {"index": 1, "embedding": [1.0]}]},
        {"data": [{"index": 0, "embedding": ["x"]}, {"index": 1, "embedding": [1.0]}]},
        {"object": "list"},
    ],
)
def test_an_answer_that_does_not_fit_is_the_nodes_failure(body: dict[str, Any]) -> None:
    with pytest.raises(NodeFailure):
        embeddings_of(body, request(), ApproxCounter())


def ok(vectors: list[list[float]]) -> web.Response:
    return web.json_response(node_answer(vectors, prompt_tokens=4))


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
@pytest.mark.anyio
async def test_a_failing_node_is_passed_over(nodes: FakeNodes) -> None:
    nodes.on("down", REFUSE)
    nodes.on("broken", answer(lambda: web.Response(status=500, text="boom")))
    nodes.on("good", answer(lambda: ok([[1.0, 0.0], [0.0, 1.0]])))
    backend = nodes.backend("down", "broken", "good")
    results = [await backend.embed(request(), Ticket("rid")) for _ in range(3)]
    assert {r.served_by.node for r in results if r.served_by} == {"good"}
    assert all(r.prompt_tokens == 4 for r in results)
    posted = nodes.bodies("good")[0]
    assert posted == {"model": "m", "input": ["a", "b"]}
    assert {seen.path for seen in nodes.seen if seen.node == "good"} == {"/good/v1/embeddings"}


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
@pytest.mark.anyio
async def test_a_nodes_400_reaches_the_client_and_no_node_left_is_a_502(nodes: FakeNodes) -> None:
    nodes.on("strict", answer(lambda: error(400, "input too long", param="input", code="context_length_exceeded")))
    with pytest.raises(APIError) as caught:
        await nodes.backend("strict").embed(request(), Ticket("rid"))
    assert (caught.value.status, caught.value.param, caught.value.message) == (400, "input", "input too long")
    nodes.on("bad", answer(lambda: web.Response(status=502)))
    with pytest.raises(UpstreamError):
        await nodes.backend("bad").embed(request(), Ticket("rid"))
