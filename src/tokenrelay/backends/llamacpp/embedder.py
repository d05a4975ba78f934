"""Embeddings on the embedded engine: requests' inputs wait in one queue, and one task takes as many as fit
a decode (the way generation steps gather every active sequence), so concurrent requests share decodes."""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from tokenrelay.backends.base import Embeddings, Vector
from tokenrelay.backends.llamacpp import prompts
from tokenrelay.backends.llamacpp.embedding_context import EmbeddingContext, EmbeddingShape
from tokenrelay.backends.llamacpp.model import LlamaModel
from tokenrelay.backends.llamacpp.pooling import Pooling, declared_pooling
from tokenrelay.config import EngineSettings
from tokenrelay.errors import CONTEXT_LENGTH_EXCEEDED, APIError, InvalidRequest, Overloaded
from tokenrelay.protocol.embeddings import EmbeddingRequest

log = logging.getLogger(__name__)


@dataclass(eq=False, slots=True)
class Pending:
    """One input waiting for its vector."""

    tokens: list[int]
    future: asyncio.Future[Vector]


class Embedder:
    """One model's embedding context and the queue in front of it. `start` and `close` run on the event loop.

    The context is made at the first decode (`open`), not with the model: a chat model that never embeds keeps no
    embedding cache or compute buffer (about 85 MiB with Gemma 3 270M)."""

    def __init__(self, model: LlamaModel, shape: EmbeddingShape, make: Callable[[], EmbeddingContext]) -> None:
        self.model = model
        self.shape = shape
        self._make = make
        self.context: EmbeddingContext | None = None
        self.decodes = 0
        self.inputs_embedded = 0
        self._waiting: deque[Pending] = deque()
        self._wake = asyncio.Event()
        self._closing = False
        self._task: asyncio.Task[None] | None = None

    @property
    def waiting(self) -> int:
        """Inputs queued for a decode (those of a request that went away included, until they are skipped)."""
        return len(self._waiting)

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name=f"embeddings {self.model.path.name}")

    def open(self) -> EmbeddingContext:
        """The context, made now if it is not yet (it decodes a probe: not on the compute thread, not on the loop)."""
        if self.context is None:
            self.context = self._make()
        return self.context

    async def close(self) -> None:
        """Finish the decode under way (its context must outlive it), fail what still waits, free the context."""
        self._closing = True
        self._wake.set()
        if self._task is not None:
            await self._task
        if self.context is not None:
            self.context.close()

    async def embed(self, request: EmbeddingRequest) -> Embeddings:
        token_lists = await asyncio.to_thread(self._tokens, request)
        if self._closing:
            raise Overloaded("The server is shutting down; retry on another replica.")
        loop = asyncio.get_running_loop()
        items = [Pending(tokens, loop.create_future()) for tokens in token_lists]
        self._waiting.extend(items)
        self._wake.set()
        try:
            vectors = await asyncio.gather(*(item.future for item in items))
        finally:
            for item in items:  # a request that went away leaves its inputs behind: they are skipped
                item.future.cancel()
        return Embeddings(list(vectors), prompt_tokens=sum(len(tokens) for tokens in token_lists))

    def _tokens(self, request: EmbeddingRequest) -> list[list[int]]:
        """Each input's tokens, checked against the vocabulary and the context (400s naming `input`)."""
        token_lists = []
        for item in request.inputs:
            if isinstance(item, str):
                tokens = self.model.tokenize(item, add_special=True, parse_special=True)
            else:
                prompts.check_token_ids(self.model, item, "input")
                tokens = item
            if len(tokens) > self.shape.max_tokens:
                raise InvalidRequest(
                    f"An input is {len(tokens)} tokens long; this model embeds at most {self.shape.max_tokens} "
                    "tokens per input.",
                    param="input",
                    code=CONTEXT_LENGTH_EXCEEDED,
                )
            if not tokens:
                raise InvalidRequest("An input has no tokens once tokenised.", param="input")
            token_lists.append(tokens)
        return token_lists

    async def _run(self) -> None:
        while not self._closing:
            await self._wake.wait()
            self._wake.clear()
            while self._waiting and not self._closing:
                batch = self._take()
                if batch:
                    await self._decode(batch)
        for item in self._waiting:
            if not item.future.done():
                item.future.set_exception(Overloaded("The server is shutting down; retry on another replica."))
        self._waiting.clear()

    def _take(self) -> list[Pending]:
        """The oldest waiting inputs that fit one decode (in arrival order, so none waits behind later ones)."""
        batch: list[Pending] = []
        tokens = 0
        while self._waiting and len(batch) < self.shape.sequences:
            head = self._waiting[0]
            if head.future.done():  # its request went away
                self._waiting.popleft()
                continue
            if batch and tokens + len(head.tokens) > self.shape.capacity:
                break  # (an input longer than a decode's capacity goes alone: the context embeds it in pieces)
            batch.append(self._waiting.popleft())
            tokens += len(head.tokens)
        return batch

    async def _decode(self, batch: list[Pending]) -> None:
        try:
            vectors = await asyncio.to_thread(lambda: self.open().embed([item.tokens for item in batch]))
        except Exception:
            log.exception("embedding decode failed; failing its %d input(s)", len(batch))
            for item in batch:
                if not item.future.done():
                    item.future.set_exception(APIError("The engine failed to evaluate the batch."))
            return
        self.decodes += 1
        self.inputs_embedded += len(batch)
        for item, vector in zip(batch, vectors, strict=True):
            if not item.future.done():
                item.future.set_result(vector)


def embedder_for(model_id: str, model: LlamaModel, settings: EngineSettings) -> Embedder | None:
    """The model's embedder (its context made at its first decode), or None for a reranking GGUF."""
    if declared_pooling(model) == Pooling.RANK:  # a reranker's output is a score, not an embedding
        log.warning("model %s is a reranking model: it serves no embeddings", model_id)
        return None
    return Embedder(model, EmbeddingShape.of(model, settings), lambda: EmbeddingContext(model, settings))


def embedding_status(embedder: Embedder | None) -> dict[str, object]:
    """What /health says of a model's embeddings."""
    if embedder is None:
        return {"embeddings": False}
    context = embedder.context
    if context is None:  # llama.cpp takes a GGUF's declared pooling (NONE for a decoder model)
        pooling, head = declared_pooling(embedder.model), "decided at the first decode"
    else:
        pooling, head = context.pooling, "skipped" if context.cut.enabled else "computed"
    return {
        "embeddings": True,
        "embedding_context": context is not None,
        "embedding_pooling": pooling.name.lower(),
        "embedding_output_head": head,
        "embedding_decodes": embedder.decodes,
        "inputs_embedded": embedder.inputs_embedded,
    }
