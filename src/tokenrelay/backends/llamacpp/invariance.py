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


def _run(context: LlamaContext, rows: list[tuple[int, int, int, bool]]) -> list[int]:
    """One `llama_decode` over (token, position, sequence, wants logits) rows; returns the rows' indices."""
    batch = context.batch
    batch.clear()
    indices = [batch.add(*row) for row in rows]
    if context.decode() != 0:
        raise RuntimeError("llama_decode failed during the batch-invariance probe")
    return indices


def _prompt_rows(tokens: list[int], seq: int) -> list[tuple[int, int, int, bool]]:
    return [(t, pos, seq, pos == len(tokens) - 1) for pos, t in enumerate(tokens)]


def batch_invariant(model: LlamaModel, context: LlamaContext, slots: int) -> bool:
    """True when a sequence's logits are bit-identical alone and sharing steps with others, the way the
    scheduler shares them: one prompt chunk plus one decoding token per other sequence."""
    if slots < 2:
        return True
    prompts = [model.tokenize(p, add_special=True, parse_special=False) for p in PROBES[: min(slots, len(PROBES))]]
    seqs = list(range(len(prompts)))
    row = lambda i: logits_row(context.ptr, i, model.n_vocab).copy()  # noqa: E731
    try:
        alone_prefill = row(_run(context, _prompt_rows(prompts[0], 0))[-1])
        token = int(np.argmax(alone_prefill))
        alone_decode = row(_run(context, [(token, len(prompts[0]), 0, True)])[0])
        context.clear(0)

        others = []
        for seq in seqs[1:]:
            last = _run(context, _prompt_rows(prompts[seq], seq))[-1]
            others.append((int(np.argmax(row(last))), len(prompts[seq]), seq, True))
        shared = _run(context, _prompt_rows(prompts[0], 0) + others)
        together_prefill = row(shared[len(prompts[0]) - 1])
        steps = [(token, len(prompts[0]), 0, True)] + [(t, p + 1, s, True) for t, p, s, _ in others]
        together_decode = row(_run(context, steps)[0])
    finally:
        for seq in seqs:
            context.clear(seq)
    return bool(np.array_equal(alone_prefill, together_prefill) and np.array_equal(alone_decode, together_decode))
