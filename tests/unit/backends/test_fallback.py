"""Fallback models (`backends/fallback.py`): which failures pass a request on, to which models, for which keys, and
how the serving model is announced; nothing falls back once the first batch is out."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest
from upstream_fakes import ON_ASYNCIO

from tokenrelay.backends.base import Embeddings, Events, ModelCard, Served, TextDelta, Ticket
from tokenrelay.backends.fallback import FallbackBackend, Fallbacks
from tokenrelay.config import ModelSettings
from tokenrelay.errors import APIError, InvalidRequest, Overloaded, UpstreamError
from tokenrelay.protocol.chat import ChatCompletionRequest
from tokenrelay.protocol.embeddings import EmbeddingRequest

pytestmark = ON_ASYNCIO

TOO_LONG = InvalidRequest("The prompt is too long.", code="context_length_exceeded")


@dataclass
class Fake:
    """A backend that fails with `error` before its first batch, or answers with its own name (then `later`)."""

    model: str
    error: APIError | None = None
    later: APIError | None = None
    context_length: int | None = 512
    member: str | None = None  # the node a routed backend names in its first batch
    asked: int = 0
    kind: str = "fake"
    card: ModelCard = field(init=False)

    def __post_init__(self) -> None:
        self.card = ModelCard(self.model, "test", 0, self.context_length)

    def fingerprint(self) -> str:
        return f"fp-{self.model}"

    def chat(self, request: ChatCompletionRequest, ticket: Ticket) -> AsyncIterator[Events]:
        self.asked += 1
        return self._events()

    async def _events(self) -> AsyncIterator[Events]:
        if self.error is not None:
            raise self.error
        served: Events = [Served(self.member, "upstream")] if self.member is not None else []
        yield [*served, TextDelta(0, self.model)]
        if self.later is not None:
            raise self.later
        yield [TextDelta(0, "!")]

    async def embed(self, request: EmbeddingRequest, ticket: Ticket) -> Embeddings:
        self.asked += 1
        if self.error is not None:
            raise self.error
        return Embeddings([np.zeros(2, dtype=np.float32)], prompt_tokens=1)


def wrapped(backends: list[Fake], settings: list[ModelSettings], allowed: set[str] | None = None) -> FallbackBackend:
    by_id = {backend.model: backend for backend in backends}
    known = {model.id: model for model in settings}
    fallbacks = Fallbacks(known.get, by_id.get, lambda m: allowed is None or m in allowed)  # type: ignore[arg-type]
    return FallbackBackend(backends[0].model, backends[0], fallbacks)  # type: ignore[arg-type]


def model(model_id: str, **fields: Any) -> ModelSettings:
    return ModelSettings(id=model_id, upstreams=[{"url": "http://127.0.0.1:1/v1"}], **fields)


CHAT = ChatCompletionRequest.model_validate({"model": "a", "messages": [{"role": "user", "content": "Hi"}]})


async def answer(backend: FallbackBackend) -> list[Events]:
    return [batch async for batch in backend.chat(CHAT, Ticket("r"))]


def texts(batches: list[Events]) -> str:
    return "".join(e.text for batch in batches for e in batch if isinstance(e, TextDelta))


def served(batches: list[Events]) -> list[Served]:
    return [e for batch in batches for e in batch if isinstance(e, Served)]


async def test_a_model_that_serves_is_answered_as_it_is() -> None:
    a, b = Fake("a", member="n1"), Fake("b")
    batches = await answer(wrapped([a, b], [model("a", fallbacks=["b"]), model("b")]))
    assert texts(batches) == "a!" and b.asked == 0
    assert [(s.node, s.model) for s in served(batches)] == [("n1", None)]


@pytest.mark.parametrize("error", [Overloaded("busy"), UpstreamError("down"), APIError("limited", status=429)])
async def test_a_model_that_cannot_serve_passes_the_request_to_its_first_fallback_that_can(error: APIError) -> None:
    a, b, c = Fake("a", error=error), Fake("b", error=Overloaded("busy too")), Fake("c", member="n3")
    backend = wrapped([a, b, c], [model("a", fallbacks=["b", "c"]), model("b"), model("c")])
    batches = await answer(backend)
    assert texts(batches) == "c!" and (a.asked, b.asked, c.asked) == (1, 1, 1)
    # The member's own `Served` now names the serving model and its fingerprint, in the first batch.
    assert [(s.node, s.model) for s in served(batches)] == [("n3", "c")]
    assert [(s.model, s.fingerprint) for s in served(batches)] == [("c", "fp-c")]
    assert isinstance(batches[0][0], Served)


async def test_an_engine_fallback_is_announced_without_a_member() -> None:
    a, b = Fake("a", error=Overloaded("queue full")), Fake("b")
    batches = await answer(wrapped([a, b], [model("a", fallbacks=["b"]), model("b")]))
    assert texts(batches) == "b!" and [(s.node, s.kind, s.model) for s in served(batches)] == [(None, "fake", "b")]


async def test_a_fallbacks_own_fallbacks_are_tried_each_model_once() -> None:
    a, b, c = Fake("a", error=Overloaded("x")), Fake("b", error=UpstreamError("y")), Fake("c", error=Overloaded("z"))
    settings = [model("a", fallbacks=["b", "c"]), model("b", fallbacks=["c"]), model("c")]
    with pytest.raises(Overloaded, match="x"):  # the error of the model asked for
        await answer(wrapped([a, b, c], settings))
    assert (a.asked, b.asked, c.asked) == (1, 1, 1)


async def test_a_prompt_over_the_context_goes_to_the_context_fallbacks_only() -> None:
    a, b, big = Fake("a", error=TOO_LONG), Fake("b"), Fake("big", context_length=8192)
    settings = [model("a", fallbacks=["b"], context_fallbacks=["big"]), model("b"), model("big")]
    backend = wrapped([a, b, big], settings)
    assert backend.card.context_length == 8192  # admission bounds max_tokens by the longest context
    batches = await answer(backend)
    assert texts(batches) == "big!" and b.asked == 0


async def test_without_context_fallbacks_an_over_long_prompt_is_the_models_400() -> None:
    a, b = Fake("a", error=TOO_LONG), Fake("b")
    with pytest.raises(InvalidRequest, match="too long"):
        await answer(wrapped([a, b], [model("a", fallbacks=["b"]), model("b")]))
    assert b.asked == 0


async def test_a_request_the_model_refuses_does_not_fall_back() -> None:
    a, b = Fake("a", error=InvalidRequest("bad logit_bias")), Fake("b")
    with pytest.raises(InvalidRequest, match="logit_bias"):
        await answer(wrapped([a, b], [model("a", fallbacks=["b"]), model("b")]))
    assert b.asked == 0


async def test_a_key_that_may_not_use_a_fallback_does_not_get_it() -> None:
    a, b, c = Fake("a", error=Overloaded("busy")), Fake("b"), Fake("c")
    settings = [model("a", fallbacks=["b", "c"]), model("b"), model("c")]
    assert texts(await answer(wrapped([a, b, c], settings, allowed={"a", "c"}))) == "c!"
    with pytest.raises(Overloaded):
        await answer(wrapped([a, b, c], settings, allowed={"a"}))
    assert b.asked == 0


async def test_nothing_falls_back_after_the_first_batch() -> None:
    a, b = Fake("a", later=UpstreamError("broke mid-stream")), Fake("b")
    got: list[Events] = []
    with pytest.raises(UpstreamError, match="mid-stream"):
        async for batch in wrapped([a, b], [model("a", fallbacks=["b"]), model("b")]).chat(CHAT, Ticket("r")):
            got.append(batch)
    assert texts(got) == "a" and b.asked == 0


async def test_embeddings_fall_back_only_to_models_that_serve_them() -> None:
    a, b, c = Fake("a", error=Overloaded("busy")), Fake("b"), Fake("c")
    settings = [model("a", fallbacks=["b", "c"]), model("b", embeddings=False), model("c")]
    request = EmbeddingRequest.model_validate({"model": "a", "input": "x"})
    result = await wrapped([a, b, c], settings).embed(request, Ticket("r"))
    assert b.asked == 0 and c.asked == 1
    assert result.served_by is not None and result.served_by.model == "c"
