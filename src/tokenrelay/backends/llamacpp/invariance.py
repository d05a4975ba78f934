"""A start-up check that a sequence's logits do not depend on what else shares its `llama_decode` step.

It is a necessary condition, not a guarantee: with it passing, greedy outputs under real concurrent load
still diverged from the same requests run alone after some tokens (see README, "Batch invariance").

Whether llama.cpp's CPU kernels are batch-invariant depends on how the library was built and set up
(repacked weights change it): so instead of assuming, the engine measures it once per context and
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


PROBE_STEPS = 32  # divergence can start many tokens in (attention over a growing cache), so decode a while


def _greedy(context: LlamaContext, model: LlamaModel, row: int) -> tuple[int, np.ndarray]:
    logits = logits_row(context.ptr, row, model.n_vocab).copy()
    return int(np.argmax(logits)), logits


def kernels_invariant(model: LlamaModel, context: LlamaContext, slots: int) -> bool:
    """True when a sequence's logits are bit-identical alone and sharing steps with others, the way the
    scheduler shares them (one prompt chunk plus one token per decoding sequence), over PROBE_STEPS tokens."""
    if slots < 2:
        return True
    prompts = [model.tokenize(p, add_special=True, parse_special=False) for p in PROBES[: min(slots, len(PROBES))]]
    seqs = list(range(len(prompts)))
    try:
        alone = []
        token, logits = _greedy(context, model, _run(context, _prompt_rows(prompts[0], 0))[-1])
        alone.append(logits)
        for step in range(PROBE_STEPS):
            token, logits = _greedy(context, model, _run(context, [(token, len(prompts[0]) + step, 0, True)])[0])
            alone.append(logits)
        context.clear(0)

        others = []  # (token, position, seq) of the other sequences, decoding alongside
        for seq in seqs[1:]:
            first, _ = _greedy(context, model, _run(context, _prompt_rows(prompts[seq], seq))[-1])
            others.append((first, len(prompts[seq]), seq))
        rows = _run(context, _prompt_rows(prompts[0], 0) + [(t, p, s, True) for t, p, s in others])
        rows = rows[len(prompts[0]) - 1 :]  # from here on: rows[0] is the probed sequence, rows[1:] the others
        token, logits = _greedy(context, model, rows[0])
        together = [logits]
        for step in range(PROBE_STEPS):
            others = [(_greedy(context, model, r)[0], p + 1, s) for r, (_, p, s) in zip(rows[1:], others, strict=True)]
            rows = _run(context, [(token, len(prompts[0]) + step, 0, True)] + [(t, p, s, True) for t, p, s in others])
            token, logits = _greedy(context, model, rows[0])
            together.append(logits)
    finally:
        for seq in seqs:
            context.clear(seq)
    return all(np.array_equal(a, b) for a, b in zip(alone, together, strict=True))
