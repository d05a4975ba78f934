"""A model's backend together with the models that serve its requests when it cannot (`fallbacks`,
`context_fallbacks` in a model's settings).

A fallback is another model, with its own members, prices and key permissions, so the choice is made above the
backends, once per call and for the caller's key (`Services.admit` wraps the model's backend only when the model
has fallbacks: every other call is served as before, without this layer). A request moves on only before the
backend it is on yielded anything, so nothing has reached the client yet; after that, a failure ends the answer
as it always does (an error event and `[DONE]`).

It moves on when the model cannot serve it now (every node down, busy or rate limited, breakers open, the
engine's queue full: a 429, 502, 503 or 504) to `fallbacks`, and when the prompt is over the model's context
(`context_length_exceeded`) to `context_fallbacks`; a fallback that cannot serve either moves on to its own, each
model tried once. A request no candidate serves gets the error of the model it asked for, the one it knows.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, replace
from typing import Literal, NamedTuple, TypeVar

from tokenrelay.backends.base import (
    Backend,
    Embeddings,
    Events,
    NativeApi,
    NativeRelay,
    NativeRequest,
    PromptCount,
    Served,
    Ticket,
    aclose_quietly,
)
from tokenrelay.config import ModelSettings
from tokenrelay.errors import CONTEXT_LENGTH_EXCEEDED, APIError
from tokenrelay.protocol.chat import ChatCompletionRequest
from tokenrelay.protocol.completions import CompletionRequest
from tokenrelay.protocol.embeddings import EmbeddingRequest

log = logging.getLogger(__name__)

T = TypeVar("T")
Reason = Literal["unavailable", "context"]

# What a backend answers when it cannot serve a request now, as opposed to a request it refuses.
UNAVAILABLE = frozenset({429, 502, 503, 504})


def reason_for(exc: APIError) -> Reason | None:
    """Why another model may serve a request that failed with `exc` before its first event (None: none may)."""
    if exc.status in UNAVAILABLE:
        return "unavailable"
    if exc.code == CONTEXT_LENGTH_EXCEEDED:
        return "context"
    return None


class Candidate(NamedTuple):
    """A model that may serve the call, and its backend."""

    model: str
    backend: Backend


@dataclass(frozen=True, slots=True)
class Fallbacks:
    """The fallbacks one call may use: configured ones that are served and the caller's key may use."""

    settings: Callable[[str], ModelSettings | None]
    find: Callable[[str], Backend | None]
    may_use: Callable[[str], bool]

    def of(self, model_id: str, reason: Reason) -> list[Candidate]:
        settings = self.settings(model_id)
        if settings is None:
            return []
        ids = settings.fallbacks if reason == "unavailable" else settings.context_fallbacks
        return [Candidate(m, backend) for m in ids if self.may_use(m) and (backend := self.find(m)) is not None]

    def reachable(self, model_id: str) -> list[Candidate]:
        """Every fallback a request for `model_id` may end up on, each once."""
        found: dict[str, Candidate] = {}
        pending = [model_id]
        while pending:
            current = pending.pop(0)
            for candidate in (*self.of(current, "unavailable"), *self.of(current, "context")):
                if candidate.model != model_id and candidate.model not in found:
                    found[candidate.model] = candidate
                    pending.append(candidate.model)
        return list(found.values())


# Told which fallback serves, before its first batch goes out: the endpoint has its answer name that model.
# Whether a fallback may serve this request (an embedding model for embeddings, a native relay for a relay).
Eligible = Callable[[Candidate], bool]


class FallbackBackend:
    """One call's backend: the model's own, then its fallbacks (made per call by `Services.admit`)."""

    def __init__(self, model_id: str, backend: Backend, fallbacks: Fallbacks) -> None:
        self.primary = Candidate(model_id, backend)
        self.fallbacks = fallbacks
        self.kind = backend.kind
        # Admission bounds a request without max_tokens by the context; a context fallback's may be longer.
        self.card = replace(backend.card, context_length=_longest([backend, *self._reachable()]))

    def _reachable(self) -> list[Backend]:
        return [candidate.backend for candidate in self.fallbacks.reachable(self.primary.model)]

    def fingerprint(self) -> str:
        return self.primary.backend.fingerprint()

    def chat(self, request: ChatCompletionRequest, ticket: Ticket) -> AsyncIterator[Events]:
        return self._serve(lambda backend: backend.chat(request, ticket), _any)

    def complete(self, request: CompletionRequest, ticket: Ticket) -> AsyncIterator[Events]:
        return self._serve(lambda backend: backend.complete(request, ticket), _any)

    async def count_chat_prompt(self, request: ChatCompletionRequest) -> PromptCount:
        return await self.primary.backend.count_chat_prompt(request)

    async def embed(self, request: EmbeddingRequest, ticket: Ticket) -> Embeddings:
        def eligible(candidate: Candidate) -> bool:
            return embeds(self.fallbacks.settings(candidate.model), request)

        served, result = await self._first(lambda backend: backend.embed(request, ticket), eligible)
        if served is not self.primary:
            result.served_by = _served_by(served, result.served_by)
        return result

    # Native relay: only to fallbacks whose nodes serve the same API themselves, so that the client gets a
    # node's own answer of the API it asked for, whoever serves it (translating mid-call would change its shape,
    # and who stores a Responses object). A request that continues a response kept on one node stays there.
    def relays(self, api: NativeApi) -> bool:
        backend = self.primary.backend
        return isinstance(backend, NativeRelay) and backend.relays(api)

    def relay(self, request: NativeRequest, request_id: str) -> AsyncIterator[Events]:
        def eligible(candidate: Candidate) -> bool:
            backend = candidate.backend
            return request.node is None and isinstance(backend, NativeRelay) and backend.relays(request.api)

        def relay(backend: Backend) -> AsyncIterator[Events]:
            assert isinstance(backend, NativeRelay)  # the primary relays (`relays`), fallbacks are eligible
            return backend.relay(request, request_id)

        return self._serve(relay, eligible)

    # Choosing -----------------------------------------------------------------------------------
    async def _serve(
        self, answer: Callable[[Backend], AsyncIterator[Events]], eligible: Eligible
    ) -> AsyncIterator[Events]:
        served, (events, first) = await self._first(lambda backend: started(lambda: answer(backend)), eligible)
        try:
            if served is not self.primary:
                first = self._announce(served, first or [])
            if first:
                yield first
            async for batch in events:
                yield batch
        finally:
            await aclose_quietly(events)

    def _announce(self, served: Candidate, first: Events) -> Events:
        """The first batch, saying which model serves: on the member's `Served` when it has one, else on a new
        one (a model on its engine alone names no member)."""
        fingerprint = served.backend.fingerprint()
        if first and isinstance(first[0], Served):
            first[0].model, first[0].fingerprint = served.model, fingerprint
            return first
        return [Served(None, served.backend.kind, served.model, fingerprint), *first]

    async def _first(self, ask: Callable[[Backend], Awaitable[T]], eligible: Eligible) -> tuple[Candidate, T]:
        """The first candidate that answers `ask`, and its answer."""
        return await self._try(self.primary, ask, eligible, {self.primary.model})

    async def _try(
        self, candidate: Candidate, ask: Callable[[Backend], Awaitable[T]], eligible: Eligible, tried: set[str]
    ) -> tuple[Candidate, T]:
        try:
            return candidate, await ask(candidate.backend)
        except APIError as exc:
            reason = reason_for(exc)
            if reason is None:
                raise
            for fallback in self.fallbacks.of(candidate.model, reason):
                if fallback.model in tried or not eligible(fallback):
                    continue
                tried.add(fallback.model)
                log.info("model %s cannot serve (%s): trying %s", candidate.model, exc.message, fallback.model)
                try:
                    return await self._try(fallback, ask, eligible, tried)
                except APIError as failure:
                    log.info("fallback %s did not serve either: %s", fallback.model, failure.message)
            raise

    # The rest of `Backend`: a call's wrapper is never registered, started or listed.
    async def start(self) -> None:
        return None

    async def close(self) -> None:
        return None

    def ready(self) -> bool:
        return self.primary.backend.ready()

    def status(self) -> dict[str, object]:
        return self.primary.backend.status()


def embeds(settings: ModelSettings | None, request: EmbeddingRequest) -> bool:
    """Whether a fallback's settings allow what the embedding endpoint allows the model asked for (a model that
    nodes brought has the defaults: embeddings, not shortened)."""
    if settings is None:
        return request.dimensions is None
    return settings.embeddings and (request.dimensions is None or settings.embeddings_truncatable)


async def started(open_events: Callable[[], AsyncIterator[Events]]) -> tuple[AsyncIterator[Events], Events | None]:
    """A backend's batches and the first of them: a request it refuses is refused by then (some checks run
    when it is asked, the rest before the first event)."""
    events = open_events()
    try:
        return events, await anext(events, None)
    except BaseException:
        await aclose_quietly(events)
        raise


def _served_by(served: Candidate, member: Served | None) -> Served:
    if member is None:
        return Served(None, served.backend.kind, served.model)
    member.model = served.model
    return member


def _longest(backends: list[Backend]) -> int | None:
    """The longest context among `backends`; None when one's is unknown (admission then assumes its default)."""
    lengths = [backend.card.context_length for backend in backends]
    known = [length for length in lengths if length is not None]
    return max(known) if len(known) == len(lengths) else None


def _any(candidate: Candidate) -> bool:
    return True
