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


def test_a_vector_is_the_same_alone_and_in_a_decode_of_many_rows_whatever_cache_the_slots_keep(
    model: LlamaModel,
) -> None:
    """Over an F16 cache llama.cpp takes a tiled attention kernel from 64 query rows and the row-by-row one below: the
    embedding context keeps a Q8_0 cache even where the short slots keep F16, so a decode's size changes nothing."""
    context = EmbeddingContext(model, SETTINGS.model_copy(update={"kv_type": "f16", "v_type": "f16"}))
    try:
        inputs = token_lists(model)
        others = [model.tokenize(TEXTS[1] * 6, add_special=True, parse_special=False)] * 2
        assert sum(map(len, others)) >= 64
        alone = context.embed([inputs[0]])[0]
        beside = context.embed([inputs[0], *others])[0]
    finally:
        context.close()
    assert np.array_equal(alone, beside)
