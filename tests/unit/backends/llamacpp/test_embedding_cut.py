"""Embedding decodes that end at the embedding, on the default Gemma model in process: the vectors are the ones the
whole graph gives, alone and batched, and a graph without the embedding node runs whole."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest

from tokenrelay.backends.llamacpp import embedding_cut
from tokenrelay.backends.llamacpp.embedding_context import EmbeddingContext
from tokenrelay.backends.llamacpp.model import LlamaModel
from tokenrelay.config import EngineSettings

SETTINGS = EngineSettings(ctx_per_slot=256, threads=2, embedding_batch=8)
TEXTS = ("Rain is expected over the hills tonight.", "def add(a, b): return a + b", "Le chat dort.")


@pytest.fixture
def context(model: LlamaModel) -> Iterator[EmbeddingContext]:
    made = EmbeddingContext(model, SETTINGS)
    yield made
    made.close()


def token_lists(model: LlamaModel) -> list[list[int]]:
    return [model.tokenize(text, add_special=True, parse_special=False) for text in TEXTS]


def test_decodes_cut_at_the_embedding_give_the_whole_graphs_vectors(
    model: LlamaModel, context: EmbeddingContext
) -> None:
    assert context.cut.enabled
    inputs = token_lists(model)
    cut_batched = context.embed(inputs)
    cut_alone = [context.embed([tokens])[0] for tokens in inputs]
    context.cut.enabled = False
    whole = context.embed(inputs)
    assert all(np.array_equal(a, b) for a, b in zip(cut_batched, whole, strict=True))
    assert all(np.array_equal(a, b) for a, b in zip(cut_alone, whole, strict=True))


def test_a_graph_without_the_embedding_node_runs_whole(
    model: LlamaModel, context: EmbeddingContext, monkeypatch: pytest.MonkeyPatch
) -> None:
    expected = context.embed(token_lists(model))
    monkeypatch.setattr(embedding_cut, "EMBEDDING_NODE", b"no such node")
    other = EmbeddingContext(model, SETTINGS)
    try:
        assert not other.cut.enabled
        got = other.embed(token_lists(model))
    finally:
        other.close()
    assert all(np.array_equal(a, b) for a, b in zip(got, expected, strict=True))
