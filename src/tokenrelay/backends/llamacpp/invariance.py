"""A start-up check that a sequence's logits do not depend on what else shares its `llama_decode` step.

Whether llama.cpp's CPU kernels are batch-invariant depends on how the library was built (llamafile's
multi-row GEMM, repacked weights): so instead of assuming, the engine measures it once per context and
reports the answer in `/health` and the log.
"""

from __future__ import annotations

import numpy as np

from tokenrelay.backends.llamacpp.context import LlamaContext
from tokenrelay.backends.llamacpp.model import LlamaModel
from tokenrelay.backends.llamacpp.sampling import logits_row

PROBES = (
    "The quick brown fox jumps over the lazy dog because",
    "In 1969 the first people to walk on the Moon were",
    "def fibonacci(n):\n    return",
    "Les trois couleurs du drapeau sont",
    "Water boils at one hundred degrees",
)


def _decode(context: LlamaContext, prompts: list[list[int]], seqs: list[int]) -> list[int]:
    """Evaluate each prompt on its sequence in one step; returns each prompt's last row index."""
    batch = context.batch
    batch.clear()
    rows = []
    for tokens, seq in zip(prompts, seqs, strict=True):
        for pos, token in enumerate(tokens):
            row = batch.add(token, pos, seq, pos == len(tokens) - 1)
        rows.append(row)
    if context.decode() != 0:
        raise RuntimeError("llama_decode failed during the batch-invariance probe")
    return rows


def _step(context: LlamaContext, tokens: list[int], positions: list[int], seqs: list[int]) -> list[int]:
    batch = context.batch
    batch.clear()
    rows = [batch.add(t, p, s, True) for t, p, s in zip(tokens, positions, seqs, strict=True)]
    if context.decode() != 0:
        raise RuntimeError("llama_decode failed during the batch-invariance probe")
    return rows


def batch_invariant(model: LlamaModel, context: LlamaContext, slots: int) -> bool:
    """True when prefill and decode give bit-identical logits alone and beside other sequences."""
    if slots < 2:
        return True
    prompts = [model.tokenize(p, add_special=True, parse_special=False) for p in PROBES[: min(slots, len(PROBES))]]
    seqs = list(range(len(prompts)))
    try:
        (row,) = _decode(context, prompts[:1], [0])
        alone_prefill = logits_row(context.ptr, row, model.n_vocab).copy()
        next_token = int(np.argmax(alone_prefill))
        (row,) = _step(context, [next_token], [len(prompts[0])], [0])
        alone_decode = logits_row(context.ptr, row, model.n_vocab).copy()
        context.clear(0)

        rows = _decode(context, prompts, seqs)
        together_prefill = logits_row(context.ptr, rows[0], model.n_vocab).copy()
        firsts = [int(np.argmax(logits_row(context.ptr, r, model.n_vocab))) for r in rows]
        firsts[0] = next_token
        rows = _step(context, firsts, [len(p) for p in prompts], seqs)
        together_decode = logits_row(context.ptr, rows[0], model.n_vocab).copy()
    finally:
        for seq in seqs:
            context.clear(seq)
    return bool(np.array_equal(alone_prefill, together_prefill) and np.array_equal(alone_decode, together_decode))
