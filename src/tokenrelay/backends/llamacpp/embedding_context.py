"""A llama.cpp context of its own with embeddings on: several whole inputs per decode, one sequence each."""

from __future__ import annotations

import logging
from dataclasses import dataclass

import llama_cpp
import numpy as np

from tokenrelay.backends.base import Vector
from tokenrelay.backends.llamacpp.context import KV_TYPES, Batch
from tokenrelay.backends.llamacpp.embedding_cut import EmbeddingCut
from tokenrelay.backends.llamacpp.model import LlamaModel
from tokenrelay.backends.llamacpp.native_thread import native_thread
from tokenrelay.backends.llamacpp.pooling import (
    Pooling,
    declared_pooling,
    is_encoder_only,
    l2_normalised,
    mean_pool,
)
from tokenrelay.config import EngineSettings

log = logging.getLogger(__name__)
CUT_PROBE = "The quick brown fox jumps over the lazy dog."


@dataclass(frozen=True, slots=True)
class EmbeddingShape:
    """How much one embedding decode takes, known from the model and the settings before any context exists."""

    max_tokens: int  # one input's tokens at most
    capacity: int  # tokens per decode
    sequences: int  # inputs per decode

    @classmethod
    def of(cls, model: LlamaModel, settings: EngineSettings) -> EmbeddingShape:
        max_tokens = min(settings.ctx_per_slot, model.n_ctx_train)
        # Where tokenrelay pools (a decoder model), llama.cpp reserves and copies out every token's logits beside its
        # embedding, computed or not (a megabyte a token with Gemma's 262,144-token vocabulary): decodes are kept
        # small, as bigger ones embed no faster. A model pooled by llama.cpp, or an encoder (its attention looks
        # ahead), needs each input whole in one decode.
        in_pieces = declared_pooling(model) == Pooling.NONE and not is_encoder_only(model)
        capacity = min(max_tokens, settings.embedding_decode_tokens) if in_pieces else max_tokens
        return cls(max_tokens, capacity, settings.embedding_batch)


class EmbeddingContext:
    """`capacity` tokens and `sequences` inputs at most per decode; an input may be `max_tokens` long (one longer
    than `capacity` is embedded alone, in pieces: see `embed`).

    The KV cache is one buffer for every sequence, cleared after each decode: a batch of inputs is laid into it
    from the first cell, each input's cells in position order, so a token's attention runs over the same
    values in the same order whatever shares its decode (the row-by-row flash-attention kernel of a Q8_0 cache
    skips the cells other sequences mask out). With the process's one matrix kernel for every row count
    (`batch_invariant`), an input's vector does not depend on what it was batched with.

    Decodes end at the embedding (`EmbeddingCut`) once a probe has shown the vectors are the same either way.
    """

    def __init__(self, model: LlamaModel, settings: EngineSettings) -> None:
        self.model = model
        self.declared = declared_pooling(model)
        # A GGUF that declares no pooling (the decoder models) keeps none here (UNSPECIFIED: the model's own), and
        # is pooled in `embed` as the mean of its token embeddings: llama.cpp's own mean is a matrix product over
        # the whole batch, whose sums would depend on where the input sat in it.
        pooling = llama_cpp.LLAMA_POOLING_TYPE_UNSPECIFIED if self.declared == Pooling.NONE else int(self.declared)
        shape = EmbeddingShape.of(model, settings)
        self.max_tokens, self.capacity, self.sequences = shape.max_tokens, shape.capacity, shape.sequences
        params = llama_cpp.llama_context_default_params()
        params.embeddings = True
        params.pooling_type = pooling
        params.n_ctx = self.max_tokens
        params.n_seq_max = self.sequences
        # One ubatch holds the whole decode: encoder models need it, and llama.cpp then never re-cuts a batch.
        params.n_batch = params.n_ubatch = self.capacity
        params.n_threads = params.n_threads_batch = settings.threads
        params.kv_unified = True
        params.swa_full = True
        params.flash_attn_type = llama_cpp.LLAMA_FLASH_ATTN_TYPE_ENABLED
        # Q8_0 whatever the short slots keep: its attention kernel is row by row at any decode size, while over an F16
        # cache llama.cpp takes a tiled kernel from 64 query rows, and a vector would depend on what shared its decode.
        params.type_k = params.type_v = KV_TYPES["q8_0"]
        params.no_perf = True
        self.cut = EmbeddingCut()
        params.cb_eval = self.cut.callback
        self.ptr = llama_cpp.llama_init_from_model(model.ptr, params)
        if not self.ptr:
            raise RuntimeError("llama.cpp could not create an embedding context (out of memory?)")
        self.memory = llama_cpp.llama_get_memory(self.ptr)  # None for an encoder model: it keeps no cache
        self.pooling = Pooling(llama_cpp.llama_pooling_type(self.ptr))
        self.n_embd = int(llama_cpp.llama_model_n_embd_out(model.ptr))
        self.batch = Batch(self.capacity)
        self.cut.enabled = self._cut_is_exact()

    def _cut_is_exact(self) -> bool:
        """Whether ending decodes at the embedding node leaves a probe's vector bit-identical; False (the whole
        graph, as llama.cpp runs it) when the graph has no such node or the vectors differ."""
        probe = self.model.tokenize(CUT_PROBE, add_special=True, parse_special=False)[: self.capacity]
        self.cut.seen = False
        whole = self.embed([probe])[0]
        if not self.cut.seen:
            log.info("embeddings of %s: the graph names no embedding node; decodes run whole", self.model.path.name)
            return False
        self.cut.enabled = True
        exact = bool(np.array_equal(self.embed([probe])[0], whole))
        if not exact:
            log.warning(
                "embeddings of %s: ending decodes at the embedding changed a vector; they run whole",
                self.model.path.name,
            )
        return exact

    def close(self) -> None:
        self.batch.close()
        if self.ptr:
            llama_cpp.llama_free(self.ptr)
            self.ptr = None

    def embed(self, inputs: list[list[int]]) -> list[Vector]:
        """One decode over `inputs` (at most `sequences` of them, `capacity` tokens in all), or one input longer
        than `capacity` alone: their normalised vectors, in order."""
        if len(inputs) == 1 and len(inputs[0]) > self.capacity:
            return [self._embed_in_pieces(inputs[0])]
        batch = self.batch
        batch.clear()
        spans = []
        for seq_id, tokens in enumerate(inputs):
            spans.append((batch.size, len(tokens)))
            for pos, token in enumerate(tokens):
                batch.add(token, pos, seq_id, True)
        try:
            self._decode()
            if self.pooling == Pooling.NONE:
                rows = self._token_rows(batch.size)
                return [l2_normalised(mean_pool(rows[start : start + n])) for start, n in spans]
            return [l2_normalised(self._sequence_row(seq_id)) for seq_id in range(len(inputs))]
        finally:
            if self.memory:
                llama_cpp.llama_memory_clear(self.memory, True)

    def _embed_in_pieces(self, tokens: list[int]) -> Vector:
        """A long input of a model pooled here, `capacity` tokens per decode with the cache kept in between: a
        token's row does not depend on where its input was cut (the kernels are batch-invariant)."""
        rows = []
        try:
            for start in range(0, len(tokens), self.capacity):
                piece = tokens[start : start + self.capacity]
                self.batch.clear()
                for offset, token in enumerate(piece):
                    self.batch.add(token, start + offset, 0, True)
                self._decode()
                rows.append(self._token_rows(len(piece)))
            return l2_normalised(mean_pool(np.concatenate(rows)))
        finally:
            if self.memory:
                llama_cpp.llama_memory_clear(self.memory, True)

    def _decode(self) -> None:
        status = native_thread().run(llama_cpp.llama_decode, self.ptr, self.batch.raw)
        if status != 0:
            raise RuntimeError(f"llama_decode failed ({status})")

    def _token_rows(self, n_tokens: int) -> Vector:
        pointer = llama_cpp.llama_get_embeddings(self.ptr)  # every token's row, in batch order
        return np.ctypeslib.as_array(pointer, shape=(n_tokens * self.n_embd,)).reshape(n_tokens, self.n_embd).copy()

    def _sequence_row(self, seq_id: int) -> Vector:
        pointer = llama_cpp.llama_get_embeddings_seq(self.ptr, seq_id)
        if not pointer:
            raise RuntimeError(f"llama.cpp has no pooled embedding for sequence {seq_id}")
        return np.ctypeslib.as_array(pointer, shape=(self.n_embd,)).copy()
