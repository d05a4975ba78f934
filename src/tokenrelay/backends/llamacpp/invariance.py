"""A start-up check that a sequence's logits do not depend on what else shares its `llama_decode` step.

Whether llama.cpp's CPU kernels are batch-invariant depends on how the library was built and set up
(repacked weights, the tiled K-quant kernel's row threshold: see `kernels`), so
instead of assuming, the engine measures it once per context and reports the answer in `/health` and the
log. The probe runs up to nine sequences side by side, so that its steps cross the 8-row threshold where
llama.cpp switches kernels. It is a necessary condition, not a guarantee (see README, "Batch invariance").
"""

from __future__ import annotations

import numpy as np

from tokenrelay.backends.llamacpp.context import LlamaContext
from tokenrelay.backends.llamacpp.model import LlamaModel
from tokenrelay.backends.llamacpp.sampling import logits_row

# The first prompt, the probed sequence, is long enough to pass 256 cache cells: from there llama.cpp's
# attention has a kernel of its own for one sequence decoding alone (see `context.KV_TYPES`).
LONG_PROBE = "The quick brown fox jumps over the lazy dog because it was bored. " * 20
PROBES = (
    LONG_PROBE,
    "In 1969 the first people to walk on the Moon were",
    "def fibonacci(n):\n    return",
    "Les trois couleurs du drapeau sont",
    "Water boils at one hundred degrees",
    "My favourite kind of weather is",
    "SELECT name FROM users WHERE",
    "Once upon a time, in a small village,",
    "The capital of Australia is",
)


def prefill(context: LlamaContext, tokens: list[int], seq: int, chunk: int) -> int:
    """Evaluate a prompt alone, in pieces of `chunk` tokens; returns the row of its last token's logits."""
    row = 0
    for start in range(0, len(tokens), chunk):
        piece = tokens[start : start + chunk]
        rows = [(t, start + i, seq, start + i == len(tokens) - 1) for i, t in enumerate(piece)]
        row = context.run(rows, prompt=True)[-1]
    return row


PROBE_STEPS = 16  # divergence can start some tokens in (attention over a growing cache), so decode a while


def _greedy(context: LlamaContext, model: LlamaModel, row: int) -> tuple[int, np.ndarray]:
    logits = logits_row(context.ptr, row, model.n_vocab).copy()
    return int(np.argmax(logits)), logits


def kernels_invariant(model: LlamaModel, context: LlamaContext, slots: int, chunk: int, together_threads: int) -> bool:
    """True when a sequence's logits are bit-identical alone and decoding beside others (one token per
    sequence per step, as the scheduler shares steps), over PROBE_STEPS tokens; the steps beside others run
    with `together_threads` (the scheduler's fewer threads beside a long prompt)."""
    if slots < 2:
        return True
    room = context.n_ctx_seq - PROBE_STEPS - 2
    count = min(slots, len(PROBES))
    prompts = [model.tokenize(p, add_special=True, parse_special=False)[:room] for p in PROBES[:count]]
    threads = context.threads
    try:
        alone = _decode(context, model, prompts[:1], chunk)
        context.clear(0)
        context.set_threads(together_threads)
        together = _decode(context, model, prompts, chunk)
    finally:
        context.set_threads(threads)
        for seq in range(len(prompts)):
            context.clear(seq)
    return all(np.array_equal(a, b) for a, b in zip(alone, together, strict=True))


def _decode(context: LlamaContext, model: LlamaModel, prompts: list[list[int]], chunk: int) -> list[np.ndarray]:
    """Greedy decoding of every prompt in lockstep; returns the first sequence's logits at every step."""
    tokens = [_greedy(context, model, prefill(context, p, seq, chunk))[0] for seq, p in enumerate(prompts)]
    first = []
    for step in range(PROBE_STEPS):
        rows = context.run([(tokens[s], len(p) + step, s, True) for s, p in enumerate(prompts)])
        drawn = [_greedy(context, model, row) for row in rows]
        tokens = [token for token, _ in drawn]
        first.append(drawn[0][1])
    return first
