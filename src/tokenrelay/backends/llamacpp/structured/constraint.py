"""One sequence's grammar during sampling: mask the logits row before the draw, advance after it."""

from __future__ import annotations

import logging

import numpy as np
from llguidance import LLMatcher, LLTokenizer

log = logging.getLogger(__name__)


class GrammarConstraint:
    """An llguidance matcher for one sequence, plus the buffer its token bitmask is written into."""

    def __init__(self, matcher: LLMatcher, n_vocab: int) -> None:
        self.matcher = matcher
        self.n_vocab = n_vocab
        self._mask = np.zeros((n_vocab + 31) // 32, dtype=np.int32)

    @classmethod
    def build(cls, tokenizer: LLTokenizer, grammar: str, n_vocab: int) -> GrammarConstraint:
        matcher = LLMatcher(tokenizer, grammar, log_level=0)
        if matcher.is_error():
            raise ValueError(matcher.get_error())
        return cls(matcher, n_vocab)

    def copy(self) -> GrammarConstraint:
        return GrammarConstraint(self.matcher.deep_copy(), self.n_vocab)

    def restrict(self, row: np.ndarray) -> None:
        """Set every token the grammar forbids next to -inf, in place."""
        self.matcher.unsafe_compute_mask_ptr(self._mask.ctypes.data, self._mask.nbytes)
        allowed = np.unpackbits(self._mask.view(np.uint8), count=self.n_vocab, bitorder="little")
        np.copyto(row, -np.inf, where=allowed == 0)

    def accept(self, token: int) -> None:
        if not self.matcher.consume_token(token):
            # Only possible when logit_bias banned every token the grammar allowed; the matcher then reports
            # itself stopped and the sequence ends there.
            log.warning("grammar rejected token %d: %s", token, self.matcher.get_error())

    @property
    def complete(self) -> bool:
        """No further token can extend the output: the sequence is finished."""
        return self.matcher.is_stopped()
