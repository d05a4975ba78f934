"""What a routed model chooses among: upstream nodes, and the embedded engine when the model has a GGUF too.

Both yield the same events and raise `NodeFailure` when another member might serve the request instead.
"""

from __future__ import annotations

import logging
import re
from collections.abc import AsyncIterator
from typing import Any, Protocol

from opentelemetry import propagate, trace

from tokenrelay.backends.base import (
    Backend,
    Embeddings,
    Events,
    NativeApi,
    NativeRequest,
    PromptCount,
    Ticket,
    aclose_quietly,
)
from tokenrelay.backends.tokens import TokenCounter
from tokenrelay.backends.upstream.bodies import completion_as_chat, node_body
from tokenrelay.backends.upstream.client import NodeClient
from tokenrelay.backends.upstream.embeddings import embedding_body, embeddings_of
from tokenrelay.backends.upstream.failures import NodeFailure
from tokenrelay.backends.upstream.health import Breaker, ProbeHealth
from tokenrelay.backends.upstream.http1 import Pool
from tokenrelay.backends.upstream.metering import Meter, TemplateAllowance
from tokenrelay.backends.upstream.native import native_relay
from tokenrelay.backends.upstream.native_usage import AnswerReader
from tokenrelay.backends.upstream.relay import Exchange, exchange_json, fetch, relay
from tokenrelay.backends.upstream.router import Load
from tokenrelay.backends.upstream.tokenizer import NodeTokenizer
from tokenrelay.backends.upstream.transport import TransportFactory
from tokenrelay.backends.upstream.wire import ChatAsCompletion, chat_events, completion_parser
from tokenrelay.config import RoutingSettings, UpstreamSettings
from tokenrelay.errors import Overloaded
from tokenrelay.protocol.chat import ChatCompletionRequest
from tokenrelay.protocol.completions import CompletionRequest
from tokenrelay.protocol.embeddings import EmbeddingRequest

log = logging.getLogger(__name__)

Request = ChatCompletionRequest | CompletionRequest


class Member(Protocol):
    name: str
    kind: str
    weight: float
    max_in_flight: int | None
    load: Load
    breaker: Breaker
    health: ProbeHealth
    last_error: str | None
    retired: bool

    def events(self, request: Request, ticket: Ticket) -> AsyncIterator[Events]: ...

    async def embed(self, request: EmbeddingRequest, ticket: Ticket) -> Embeddings: ...

    async def close(self) -> None: ...

    def status(self) -> dict[str, Any]: ...


def _routing_state(member: Member) -> dict[str, Any]:
    ewma = member.load.latency_ewma
    return {
        "name": member.name,
        "weight": member.weight,
        "max_in_flight": member.max_in_flight,
        "in_flight": member.load.in_flight,
        "requests": member.load.requests,
        "errors": member.load.failures,
        "breaker": str(member.breaker.state),
        "healthy": member.health.healthy,
        "latency_ms_ewma": None if ewma is None else round(ewma * 1000, 1),
    }


def _breaker(routing: RoutingSettings) -> Breaker:
    return Breaker(routing.health.breaker_failures, routing.health.breaker_cooldown)


class Node:
    """One upstream node: its client, and what the router and the breaker know of it."""

    kind = "upstream"

    def __init__(
        self,
        settings: UpstreamSettings,
        model_id: str,
        routing: RoutingSettings,
        counter: TokenCounter,
        transport: TransportFactory = Pool,
    ) -> None:
        self.settings = settings
        self.name = settings.label
        self.weight = settings.weight
        self.max_in_flight = settings.max_in_flight
        self.node_model = settings.model or model_id
        self.routing = routing
        self.counter = counter
        self.client = NodeClient(settings, routing.timeouts, transport)
        self.tokenizer = NodeTokenizer(settings, routing.timeouts, transport)
        self.template = TemplateAllowance(counter)
        self.load = Load()
        self.breaker = _breaker(routing)
        self.health = ProbeHealth(routing.health.unhealthy_after)
        self.last_error: str | None = None
        self.retired = False

    def events(self, request: Request, ticket: Ticket) -> AsyncIterator[Events]:
        exchange = self._exchange(request)
        headers = trace_headers(ticket.request_id)
        meter = Meter(request, self.counter, self.template)
        return relay(self.client, exchange, headers, self.routing.timeouts, meter)

    def serves_natively(self, api: NativeApi) -> bool:
        return api in self.settings.native_apis

    def relay(self, request: NativeRequest, request_id: str) -> AsyncIterator[Events]:
        """The node's own answer to a Responses or Messages request sent as the client wrote it (`native.py`)."""
        reader = AnswerReader(request.api, Meter(request.chat, self.counter))
        headers = self._native_headers(request, request_id)
        return native_relay(self.client, request, self.node_model, headers, self.routing.timeouts, reader)

    async def count_native(self, request: NativeRequest, request_id: str) -> int:
        """The node's own `count_tokens` of a Messages request sent as the client wrote it."""
        body = {**request.body, "model": self.node_model}
        headers = self._native_headers(request, request_id)
        answer = await exchange_json(self.client, f"{request.path}/count_tokens", body, headers, self.routing.timeouts)
        tokens = answer.get("input_tokens")
        if not isinstance(tokens, int) or isinstance(tokens, bool):
            raise NodeFailure("the node's count has no input_tokens")
        return tokens

    async def count_prompt(self, request: ChatCompletionRequest) -> PromptCount:
        """The prompt tokens the node would evaluate for `request`: by its tokenizer endpoint, or else estimated
        with what its template was seen to add."""
        count = await self.tokenizer.count(node_body(request, self.node_model), {})
        return PromptCount(count) if count is not None else PromptCount(self.template.estimate(request), True)

    def _native_headers(self, request: NativeRequest, request_id: str) -> dict[str, str]:
        headers = trace_headers(request_id) | request.headers
        if request.api == "messages" and self.settings.api_key is not None:
            headers["x-api-key"] = self.settings.api_key.get_secret_value()  # Anthropic's key header
        return headers

    async def fetch(self, method: str, path: str, request_id: str) -> tuple[int, bytes]:
        """The node's status and answer to a bodiless request under its URL (a stored response read or deleted)."""
        return await fetch(self.client, method, path, trace_headers(request_id), self.routing.timeouts)

    async def embed(self, request: EmbeddingRequest, ticket: Ticket) -> Embeddings:
        body = embedding_body(request, self.node_model)
        answer = await exchange_json(
            self.client,
            "/embeddings",
            body,
            trace_headers(ticket.request_id),
            self.routing.timeouts,
        )
        return embeddings_of(answer, request, self.counter)

    def _exchange(self, request: Request) -> Exchange:
        if isinstance(request, ChatCompletionRequest):
            return Exchange("/chat/completions", node_body(request, self.node_model), chat_events)
        if self.settings.completions_via_chat:
            body = completion_as_chat(request, self.node_model)
            return Exchange("/chat/completions", body, ChatAsCompletion())
        return Exchange("/completions", node_body(request, self.node_model), completion_parser)

    async def probe(self) -> None:
        ok = await self.client.probe(self.routing.health.probe_path, self.routing.health.probe_timeout)
        if self.health.healthy and not ok:
            log.warning("node %s failed a health probe", self.name)
        self.health.record(ok)

    async def close(self) -> None:
        await self.client.close()
        await self.tokenizer.close()

    def status(self) -> dict[str, Any]:
        return _routing_state(self) | {
            "url": self.settings.node_url.shown,
            "model": self.node_model,
            "completions_via_chat": self.settings.completions_via_chat,
            "native_apis": list(self.settings.native_apis),
            "last_error": self.last_error,
        }


class EmbeddedMember:
    """The model's in-process engine taking its share of requests next to the nodes."""

    name = "embedded"

    def __init__(self, backend: Backend, routing: RoutingSettings, max_in_flight: int | None) -> None:
        self.backend = backend
        self.kind = backend.kind
        self.weight = 1.0
        self.max_in_flight = max_in_flight
        self.load = Load()
        self.breaker = _breaker(routing)
        self.health = ProbeHealth(1)
        self.last_error: str | None = None
        self.retired = False

    async def events(self, request: Request, ticket: Ticket) -> AsyncIterator[Events]:
        try:
            if isinstance(request, ChatCompletionRequest):
                source = self.backend.chat(request, ticket)
            else:
                source = self.backend.complete(request, ticket)
            try:
                async for events in source:
                    yield events
            finally:
                await aclose_quietly(source)
        except Overloaded:
            # A full queue here is no reason to refuse the client while a node may have room.
            raise NodeFailure("engine busy", busy=True) from None

    async def embed(self, request: EmbeddingRequest, ticket: Ticket) -> Embeddings:
        try:
            return await self.backend.embed(request, ticket)
        except Overloaded:
            raise NodeFailure("engine busy", busy=True) from None

    async def close(self) -> None:
        await self.backend.close()

    def status(self) -> dict[str, Any]:
        return _routing_state(self) | {"engine": self.backend.status()}


_UUID = re.compile(r"[0-9a-f]{32}|[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}", re.IGNORECASE)


def trace_headers(request_id: str) -> dict[str, str]:
    """The request id for the node's logs, when it is a UUID (ours always are; a client's may not be), and the
    current span's `traceparent` when the call is traced (the attempt's span), so a node's own spans join the trace.

    Some nodes refuse any other `X-Request-ID` (llama-cpp-python's server answers 400), so a client's
    free-form id stays with us rather than break the request.
    """
    headers = {"X-Request-ID": request_id} if _UUID.fullmatch(request_id) else {}
    if trace.get_current_span().get_span_context().is_valid:  # an untraced call sends no traceparent
        propagate.inject(headers)
    return headers
