"""llguidance's view of a model's vocabulary, built once per model on the first constrained request."""

from __future__ import annotations

import asyncio
import logging
import time

import llguidance
import llguidance.llamacpp

from tokenrelay.backends.llamacpp.model import LlamaModel

log = logging.getLogger(__name__)


def build_tokenizer(model: LlamaModel) -> llguidance.LLTokenizer:
    """Every end-of-generation token counts as the grammar's end, so a finished answer may stop on any of them
    (Gemma ends turns with `<end_of_turn>`, not `<eos>`)."""
    started = time.perf_counter()
    ends = [token for token in range(model.n_vocab) if model.is_eog(token)]
    tokenizer = llguidance.llamacpp.lltokenizer_from_vocab(model.vocab, n_vocab=model.n_vocab, eos_token=ends)
    log.info("grammar tokenizer for %s built in %.1f s", model.path.name, time.perf_counter() - started)
    return tokenizer


class GrammarVocabulary:
    """Builds the tokenizer lazily (a few seconds over a 262k vocabulary) off the event loop, exactly once;
    requests arriving meanwhile wait for the same build. Models that never see a constrained request pay
    nothing."""

    def __init__(self, model: LlamaModel) -> None:
        self._model = model
        self._build: asyncio.Future[llguidance.LLTokenizer] | None = None

    async def tokenizer(self) -> llguidance.LLTokenizer:
        if self._build is None or self._failed(self._build):
            self._build = asyncio.ensure_future(asyncio.to_thread(build_tokenizer, self._model))
        # Shielded: one caller going away must not cancel the build the others are waiting for.
        return await asyncio.shield(self._build)

    @staticmethod
    def _failed(build: asyncio.Future[llguidance.LLTokenizer]) -> bool:
        """A failed build is retried by the next request rather than failing every request forever."""
        return build.done() and (build.cancelled() or build.exception() is not None)
