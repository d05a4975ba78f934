"""The embedding queue: waiting inputs of concurrent requests share decodes, up to the context's limits."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tokenrelay.backends.llamacpp.embedder import Embedder
from tokenrelay.backends.llamacpp.embedding_context import EmbeddingShape
from tokenrelay.errors import InvalidRequest
from tokenrelay.protocol.embeddings import EmbeddingRequest

pytestmark = [pytest.mark.anyio, pytest.mark.parametrize("anyio_backend", ["asyncio"])]


class FakeModel:
    """One token per character; a vocabulary of 100 ids."""

    path = Path("fake.gguf")
    n_vocab = 100

    def tokenize(self, text: str, *, add_special: bool, parse_special: bool) -> list[int]:
        return [ord(c) % 100 for c in text]


class FakeContext:
    """Records each decode's inputs; a decode waits for `release` so that requests can pile up meanwhile."""

    def __init__(self, sequences: int = 4, capacity: int = 12, max_tokens: int = 8) -> None:
        self.sequences, self.capacity, self.max_tokens = sequences, capacity, max_tokens
        self.decodes: list[list[list[int]]] = []
        self.entered = threading.Event()  # a decode is under way
        self.release = threading.Event()
        self.closed = False

    def embed(self, inputs: list[list[int]]) -> list[np.ndarray]:
        self.entered.set()
        self.release.wait(5)
        self.decodes.append(inputs)
        return [np.asarray([len(tokens), sum(tokens)], dtype=np.float32) for tokens in inputs]

    def close(self) -> None:
        self.closed = True


def request(value: Any) -> EmbeddingRequest:
    return EmbeddingRequest.model_validate_json(json.dumps({"model": "m", "input": value}), strict=True)


async def until(condition: Callable[[], bool]) -> None:
    """Yield to the loop (and the embedder's threads) until `condition` holds."""
    async with asyncio.timeout(10):
        while not condition():
            await asyncio.sleep(0.001)


async def started(context: FakeContext) -> Embedder:
    shape = EmbeddingShape(context.max_tokens, context.capacity, context.sequences)
    embedder = Embedder(FakeModel(), shape, lambda: context)  # type: ignore[arg-type, return-value]
    embedder.start()
    return embedder


async def test_concurrent_requests_share_decodes_within_the_limits() -> None:
    context = FakeContext(sequences=4, capacity=12)
    embedder = await started(context)
    first = asyncio.create_task(embedder.embed(request("ab")))
    await until(context.entered.is_set)  # the first decode is under way, holding only the first request's input
    others = [asyncio.create_task(embedder.embed(request(["abc", "de", "fgh"]))) for _ in range(2)]
    await until(lambda: embedder.waiting == 6)
    context.release.set()
    results = await asyncio.gather(first, *others)
    assert [len(decode) for decode in context.decodes] == [1, 4, 2]  # at most 4 inputs, 12 tokens a decode
    assert all(sum(map(len, decode)) <= 12 for decode in context.decodes)
    assert [v.tolist()[0] for v in results[1].vectors] == [3.0, 2.0, 3.0]  # each request's own, in order
    assert results[1].prompt_tokens == 8 and results[0].prompt_tokens == 2
    await embedder.close()
    assert context.closed


async def test_an_input_longer_than_a_decode_goes_alone() -> None:
    context = FakeContext(sequences=4, capacity=6, max_tokens=20)
    context.release.set()
    embedder = await started(context)
    answer = await embedder.embed(request(["ab", "x" * 15, "cd", "ef"]))
    assert [[len(tokens) for tokens in decode] for decode in context.decodes] == [[2], [15], [2, 2]]
    assert [v.tolist()[0] for v in answer.vectors] == [2.0, 15.0, 2.0, 2.0]
    await embedder.close()


async def test_a_cancelled_requests_inputs_are_skipped() -> None:
    context = FakeContext()
    embedder = await started(context)
    busy = asyncio.create_task(embedder.embed(request("a")))
    await until(context.entered.is_set)
    gone = asyncio.create_task(embedder.embed(request(["bb", "cc"])))
    await until(lambda: embedder.waiting == 2)
    gone.cancel()
    kept = asyncio.create_task(embedder.embed(request("dd")))
    await until(lambda: embedder.waiting == 3)
    context.release.set()
    await asyncio.gather(busy, kept)
    assert context.decodes == [[[ord("a") % 100]], [[0, 0]]]  # "dd": 100 % 100 twice
    await embedder.close()


@pytest.mark.parametrize("value", ["x" * 9, [[1, 2], [100]]])
async def test_inputs_too_long_or_outside_the_vocabulary_are_400s_naming_input(value: Any) -> None:
    embedder = await started(FakeContext(max_tokens=8))
    with pytest.raises(InvalidRequest) as caught:
        await embedder.embed(request(value))
    assert caught.value.param == "input"
    await embedder.close()


async def test_the_context_is_made_at_the_first_decode_and_once() -> None:
    made: list[FakeContext] = []

    def make() -> FakeContext:
        made.append(FakeContext())
        made[-1].release.set()
        return made[-1]

    embedder = Embedder(FakeModel(), EmbeddingShape(8, 12, 4), make)  # type: ignore[arg-type]
    embedder.start()
    with pytest.raises(InvalidRequest):
        await embedder.embed(request("x" * 9))  # refused before any decode: no context for it
    assert made == []
    await embedder.embed(request("ab"))
    await embedder.embed(request(["cd", "ef"]))
    assert len(made) == 1 and made[0].decodes == [[[97 % 100, 98 % 100]], [[99, 0], [1, 2]]]
    await embedder.close()
    assert made[0].closed
