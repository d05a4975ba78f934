"""Per-sequence sampling: logit bias and OpenAI penalties in NumPy, the draw in llama.cpp's sampler chain.

Bias and penalties are applied to the context's logits row in place (sparse and cheap), then llama.cpp's
chain (top-k → temperature → top-p → seeded draw, or greedy) picks the token. Logprobs are computed from that same
modified row, so they describe the distribution the token was actually drawn from.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from dataclasses import dataclass, field

import llama_cpp
import numpy as np

from tokenrelay.backends.llamacpp.structured.constraint import GrammarConstraint

BAN = -100.0  # a bias of -100 bans the token outright, as the OpenAI API describes


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


@dataclass(slots=True)
class Draw:
    token: int
    logprob: float | None = None
    top: list[tuple[int, float]] = field(default_factory=list)


def logits_row(ctx: llama_cpp.llama_context_p, index: int, n_vocab: int) -> np.ndarray:
    """A writable NumPy view of one output row of the context's logits (no copy)."""
    return np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(ctx, index), shape=(n_vocab,))


def log_softmax(row: np.ndarray, temperature: float = 1.0) -> np.ndarray:
    scaled = row / temperature if temperature not in (0.0, 1.0) else row
    peak = np.max(scaled)
    return scaled - (peak + np.log(np.sum(np.exp(scaled - peak))))


def top_k(logprobs: np.ndarray, k: int) -> list[tuple[int, float]]:
    """The k most likely tokens; tokens that could not be drawn (banned, or outside a grammar) are never listed,
    so fewer than k come back when fewer were possible."""
    if k <= 0:
        return []
    ids = np.argpartition(logprobs, -k)[-k:]
    ids = ids[np.argsort(-logprobs[ids], kind="stable")]
    return [(int(i), float(logprobs[i])) for i in ids if logprobs[i] > -np.inf]


class TokenSampler:
    """One sequence's sampler: owns its llama.cpp chain (and so its seeded random state) and its counts.

    A grammar constraint, when given, masks the row after bias and penalties and before the draw, so the
    chain (and the logprobs) see only tokens the grammar allows; unconstrained sequences skip it entirely.
    """

    def __init__(self, params: SamplingParams, n_vocab: int, constraint: GrammarConstraint | None = None) -> None:
        self.params = params
        self.n_vocab = n_vocab
        self.constraint = constraint
        self.counts: Counter[int] = Counter()
        self._bias_ids = np.fromiter(params.logit_bias.keys(), dtype=np.int64, count=len(params.logit_bias))
        self._bias_values = np.array([-np.inf if v <= BAN else v for v in params.logit_bias.values()], dtype=np.float32)
        self.chain = self._build_chain(params)

    @staticmethod
    def _build_chain(params: SamplingParams) -> llama_cpp.llama_sampler_p:
        chain = llama_cpp.llama_sampler_chain_init(llama_cpp.llama_sampler_chain_default_params())
        if params.greedy:
            llama_cpp.llama_sampler_chain_add(chain, llama_cpp.llama_sampler_init_greedy())
            return chain
        if params.top_k > 0:
            llama_cpp.llama_sampler_chain_add(chain, llama_cpp.llama_sampler_init_top_k(params.top_k))
        llama_cpp.llama_sampler_chain_add(chain, llama_cpp.llama_sampler_init_temp(params.temperature))
        if params.top_p < 1.0:
            llama_cpp.llama_sampler_chain_add(chain, llama_cpp.llama_sampler_init_top_p(params.top_p, 1))
        llama_cpp.llama_sampler_chain_add(chain, llama_cpp.llama_sampler_init_dist(params.seed))
        return chain

    @property
    def complete(self) -> bool:
        """The grammar, if any, admits no further token."""
        return self.constraint is not None and self.constraint.complete

    def close(self) -> None:
        if self.chain:
            llama_cpp.llama_sampler_free(self.chain)
            self.chain = None

    def _adjust(self, row: np.ndarray) -> None:
        if self._bias_ids.size:
            row[self._bias_ids] += self._bias_values
        p = self.params
        if self.counts and (p.presence_penalty or p.frequency_penalty):
            ids = np.fromiter(self.counts.keys(), dtype=np.int64, count=len(self.counts))
            seen = np.fromiter(self.counts.values(), dtype=np.float32, count=len(self.counts))
            row[ids] -= seen * p.frequency_penalty + p.presence_penalty

    def sample(self, ctx: llama_cpp.llama_context_p, index: int) -> Draw:
        row = logits_row(ctx, index, self.n_vocab)
        self._adjust(row)
        if self.constraint is not None:
            self.constraint.restrict(row)
        token = int(llama_cpp.llama_sampler_sample(self.chain, ctx, index))
        if self.constraint is not None:
            self.constraint.accept(token)
        self.counts[token] += 1
        draw = Draw(token)
        p = self.params
        if p.top_logprobs is not None or p.score:
            logprobs = log_softmax(row, p.temperature or 1.0)
            draw.logprob = float(logprobs[token])
            draw.top = top_k(logprobs, p.top_logprobs or 0)
        return draw
