"""Per-sequence sampling in NumPy, straight on the context's logits row.

Logit bias, OpenAI's penalties and a grammar's mask are applied to the row in place; then the token is the row's
argmax (greedy) or a draw from the temperature-scaled distribution, cut to Anthropic's `top_k` and OpenAI's
`top_p` nucleus when asked, with uniform numbers from the sequence's own seeded generator. Logprobs come from the
same scaled row (before any top-k or top-p cut), so they describe the distribution the token was drawn from.
"""

from __future__ import annotations

import hashlib
import math
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import llama_cpp
import numpy as np

from tokenrelay.backends.llamacpp.structured.constraint import GrammarConstraint

BAN = -100.0  # a bias of -100 bans the token outright, as the OpenAI API describes
# A draw from the whole vocabulary computes the weights of the tokens within TAIL (in units of the temperature) of
# the most likely one; each of the others weighs less than exp(-TAIL) of it, and they are only counted as a bound
# (see `draw_whole`). Most of a model's vocabulary is that far below the top.
TAIL = 16.0
# Where candidates for a top-k or top-p cut are looked for first: weights relative to the most likely token's.
# A comparison pass over the vocabulary is much cheaper than ordering it, and the cut is nearly always near the top.
WEIGHT_CUTOFFS = (1e-2, 1e-3, 1e-4, 1e-5, 1e-6, 1e-7, 1e-8)
LOGIT_MARGINS = (4.0, 16.0)  # the same for the k most likely tokens listed as top logprobs, in logits


def derive_seed(seed: int | None, index: int) -> int:
    """A 32-bit seed for one choice: stable across restarts, different for each choice of a request."""
    if seed is None:
        return int.from_bytes(np.random.default_rng().bytes(4), "little")
    digest = hashlib.blake2b(f"{seed}:{index}".encode(), digest_size=4).digest()
    return int.from_bytes(digest, "little")


@dataclass(frozen=True, slots=True)
class SamplingParams:
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0: no top-k cut
    seed: int = 0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logit_bias: dict[int, float] = field(default_factory=dict)
    top_logprobs: int | None = None  # None: no logprobs wanted
    score: bool = False  # track the chosen tokens' logprobs (best_of ranking) even without logprobs

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def truncated(self) -> bool:
        return self.top_k > 0 or self.top_p < 1.0


@dataclass(slots=True)
class Draw:
    token: int
    logprob: float | None = None
    top: list[tuple[int, float]] = field(default_factory=list)


def logits_row(ctx: llama_cpp.llama_context_p, index: int, n_vocab: int) -> np.ndarray:
    """A writable NumPy view of one output row of the context's logits (no copy)."""
    return np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(ctx, index), shape=(n_vocab,))


@dataclass(frozen=True, slots=True)
class Scaled:
    """A row's distribution at a temperature: weights exp((logit - peak) / temperature) and their sum."""

    row: np.ndarray
    peak: float
    temperature: float
    weights: np.ndarray
    total: float

    def logprob(self, token: int) -> float:
        return (float(self.row[token]) - self.peak) / self.temperature - float(np.log(self.total))

    def top(self, k: int) -> list[tuple[int, float]]:
        """The k most likely tokens; tokens that could not be drawn (banned, or outside a grammar) are never
        listed, so fewer than k come back when fewer were possible."""
        if k <= 0:
            return []
        ids = leading(self.row, [self.peak - m for m in LOGIT_MARGINS], -np.inf, lambda ids: ids.size >= k)[:k]
        return [(int(i), self.logprob(int(i))) for i in ids]


def scale(row: np.ndarray, temperature: float) -> Scaled:
    """The row's distribution at `temperature`."""
    peak = float(np.max(row))
    if peak == -np.inf:  # nothing allowed at all (every token the grammar allows is banned): draw any
        return scale(np.zeros_like(row), temperature)
    weights = row - np.float32(peak)
    if temperature != 1.0:
        np.multiply(weights, np.float32(1.0 / temperature), out=weights)
    np.exp(weights, out=weights)
    return Scaled(row, peak, temperature, weights, float(weights.sum(dtype=np.float64)))


def pick(cumulative: np.ndarray, weights: np.ndarray, u: float) -> int:
    """The index whose interval of the cumulative sums holds `u`; never one of weight zero (rounding at the end
    of the range falls back to the last positive weight)."""
    i = min(int(np.searchsorted(cumulative, u, side="right")), cumulative.size - 1)
    while i > 0 and weights[i] <= 0:
        i -= 1
    return i


def draw_whole(row: np.ndarray, temperature: float, rng: np.random.Generator) -> int:
    """A draw from the whole distribution exp((logit - peak) / temperature), exactly, computing few weights.

    A uniform number lands in [0, head + bound): `head` is the sum of the weights of the tokens near the top, and
    `bound` is more than the rest can weigh (their count times exp(-TAIL)). Landing in the head picks one of its
    tokens; landing past it (rarely: the bound is a tiny share) computes the rest's weights and picks one of them
    if it falls inside their sum, or draws again if it falls in the bound's slack. So every token is drawn with
    probability proportional to its weight, and most draws never compute the far tail.
    """
    peak = float(np.max(row))
    if peak == -np.inf:  # nothing allowed at all (every token the grammar allows is banned): draw any
        return int(rng.integers(row.size))
    floor = np.float32(peak - TAIL * temperature)
    near = np.flatnonzero(row >= floor)
    near_weights = _weights(row[near], peak, temperature)
    near_cumulative = np.cumsum(near_weights)
    head = float(near_cumulative[-1])
    bound = (row.size - near.size) * math.exp(-TAIL)
    while True:
        target = rng.random() * (head + bound)
        if target < head:
            return int(near[pick(near_cumulative, near_weights, target)])
        far = np.flatnonzero(row < floor)
        far_weights = _weights(row[far], peak, temperature)
        far_cumulative = np.cumsum(far_weights)
        if far.size and target - head < far_cumulative[-1]:
            return int(far[pick(far_cumulative, far_weights, target - head)])


def _weights(logits: np.ndarray, peak: float, temperature: float) -> np.ndarray:
    return np.exp((logits.astype(np.float64) - peak) / temperature)


def leading(
    values: np.ndarray, cutoffs: Sequence[float], floor: float, enough: Callable[[np.ndarray], bool]
) -> np.ndarray:
    """Ids of the largest values, in descending order (ties by id): those above the first cutoff whose set is
    `enough`, else all above `floor`."""
    for cutoff in cutoffs:
        ids = np.flatnonzero(values >= cutoff)
        if enough(ids):
            break
    else:
        ids = np.flatnonzero(values > floor)
    return ids[np.argsort(-values[ids], kind="stable")]


def draw_truncated(scaled: Scaled, top_k: int, top_p: float, u: float) -> int:
    """A draw from the k most likely tokens (if `top_k`), then from the smallest set of those whose
    probability reaches `top_p` (OpenAI's nucleus), renormalised."""
    weights = scaled.weights

    def enough(ids: np.ndarray) -> bool:
        return (top_k > 0 and ids.size >= top_k) or (top_p < 1.0 and weights[ids].sum() >= top_p * scaled.total)

    ids = leading(weights, WEIGHT_CUTOFFS, 0.0, enough)
    if top_k > 0:
        ids = ids[:top_k]
    kept = weights[ids].astype(np.float64)
    cumulative = np.cumsum(kept)
    if top_p < 1.0:
        size = min(int(np.searchsorted(cumulative, top_p * cumulative[-1], side="left")) + 1, ids.size)
        ids, kept, cumulative = ids[:size], kept[:size], cumulative[:size]
    return int(ids[pick(cumulative, kept, u * float(cumulative[-1]))])


class TokenSampler:
    """One sequence's sampler: its random generator (seeded), its token counts (penalties), its grammar.

    A grammar constraint, when given, masks the row after bias and penalties and before the draw, so the draw
    (and the logprobs) see only tokens the grammar allows; unconstrained sequences skip it entirely.
    """

    def __init__(self, params: SamplingParams, n_vocab: int, constraint: GrammarConstraint | None = None) -> None:
        self.params = params
        self.n_vocab = n_vocab
        self.constraint = constraint
        self.counts: Counter[int] = Counter()
        self.rng = np.random.default_rng(params.seed)
        self._bias_ids = np.fromiter(params.logit_bias.keys(), dtype=np.int64, count=len(params.logit_bias))
        self._bias_values = np.array([-np.inf if v <= BAN else v for v in params.logit_bias.values()], dtype=np.float32)

    @property
    def complete(self) -> bool:
        """The grammar, if any, admits no further token."""
        return self.constraint is not None and self.constraint.complete

    def _adjust(self, row: np.ndarray) -> None:
        if self._bias_ids.size:
            row[self._bias_ids] += self._bias_values
        p = self.params
        if self.counts and (p.presence_penalty or p.frequency_penalty):
            ids = np.fromiter(self.counts.keys(), dtype=np.int64, count=len(self.counts))
            seen = np.fromiter(self.counts.values(), dtype=np.float32, count=len(self.counts))
            row[ids] -= seen * p.frequency_penalty + p.presence_penalty

    def sample(self, ctx: llama_cpp.llama_context_p, index: int) -> Draw:
        return self.sample_row(logits_row(ctx, index, self.n_vocab))

    def sample_row(self, row: np.ndarray) -> Draw:
        """Adjust the row in place, choose a token from it and account for it."""
        self._adjust(row)
        if self.constraint is not None:
            self.constraint.restrict(row)
        p = self.params
        wants_logprobs = p.top_logprobs is not None or p.score
        scaled = None
        if p.greedy:
            token = int(np.argmax(row))
        elif p.truncated:
            scaled = scale(row, p.temperature)
            token = draw_truncated(scaled, p.top_k, p.top_p, float(self.rng.random()))
        else:
            token = draw_whole(row, p.temperature, self.rng)
        if self.constraint is not None:
            self.constraint.accept(token)
        self.counts[token] += 1
        draw = Draw(token)
        if wants_logprobs:
            if scaled is None:
                scaled = scale(row, 1.0 if p.greedy else p.temperature)
            draw.logprob = scaled.logprob(token)
            draw.top = scaled.top(p.top_logprobs or 0)
        return draw
