"""A model served by upstream nodes (and possibly its embedded engine): the `Backend` that routes and fails over.

Failover happens only before the client has received anything: a member's events are held back until
its first one arrives, so a node that cannot connect, times out, answers 5xx or 429, or breaks before its
first chunk is passed over for the next. Once the first event has gone out, a failure ends the stream
(the renderer turns it into an error event and `[DONE]`) after a usage event for what was sent.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from typing import TypeVar

from opentelemetry.trace import Span, Tracer

from tokenrelay import __version__
from tokenrelay.backends.base import (
    Embeddings,
    Events,
    ModelCard,
    NativeApi,
    NativeRequest,
    PromptCount,
    Served,
    Ticket,
    aclose_quietly,
)
from tokenrelay.backends.tokens import ApproxCounter, TokenCounter, prompt_tokens
from tokenrelay.backends.upstream.attempt_spans import attempt_span, end_attempt, use_span
from tokenrelay.backends.upstream.failures import NodeFailure, broken_stream, exhausted
from tokenrelay.backends.upstream.http1 import Pool
from tokenrelay.backends.upstream.members import EmbeddedMember, Member, Node, Request
from tokenrelay.backends.upstream.router import affinity_key, choose
from tokenrelay.backends.upstream.transport import TransportFactory
from tokenrelay.config import RoutingSettings, UpstreamSettings
from tokenrelay.errors import APIError, Overloaded, UpstreamError
from tokenrelay.protocol.chat import ChatCompletionRequest
from tokenrelay.protocol.completions import CompletionRequest
from tokenrelay.protocol.embeddings import EmbeddingRequest

log = logging.getLogger(__name__)

M = TypeVar("M", bound=Member)
T = TypeVar("T")


class RoutedBackend:
    """One model id over a changing set of members; nodes can be added and removed while serving."""

    kind = "upstream"

    def __init__(
        self,
        model_id: str,
        routing: RoutingSettings,
        nodes: Sequence[UpstreamSettings] = (),
        *,
        embedded: EmbeddedMember | None = None,
        counter: TokenCounter | None = None,
        dynamic: bool = False,
        tracer: Tracer | None = None,
        transport: TransportFactory = Pool,
    ) -> None:
        self.card = ModelCard(id=model_id, owned_by="tokenrelay", created=int(time.time()))
        self.routing = routing
        self.embedded = embedded
        self.counter = counter or ApproxCounter()
        self.transport = transport  # what each node's connections are made with (tests and benchmarks fake it)
        self.dynamic = dynamic  # created by a node's registration: removed with its last node
        self.tracer = tracer  # set when traces are exported: each attempt on a member is a span
        self.nodes: dict[str, Node] = {}
        self._picks = 0
        self._prober: asyncio.Task[None] | None = None
        self._fingerprint = "fp_" + hashlib.sha256(f"{model_id}:upstream:{__version__}".encode()).hexdigest()[:10]
        for settings in nodes:  # names are unique (checked with the settings)
            node = self._node(settings)
            self.nodes[node.name] = node

    def _node(self, settings: UpstreamSettings) -> Node:
        return Node(settings, self.card.id, self.routing, self.counter, self.transport)

    # Membership ---------------------------------------------------------------------------------
    async def add_node(self, settings: UpstreamSettings) -> Node:
        """Add a node, or replace the one with the same name (a node re-registering after a restart)."""
        node = self._node(settings)
        old = self.nodes.pop(node.name, None)
        self.nodes[node.name] = node
        if old is not None:
            await self._retire(old)
        return node

    async def remove_node(self, name: str) -> bool:
        node = self.nodes.pop(name, None)
        if node is not None:
            await self._retire(node)
        return node is not None

    async def _retire(self, node: Node) -> None:
        # Requests already on the node finish; its connections close once the last one has.
        node.retired = True
        if node.load.in_flight == 0:
            await node.close()

    @property
    def members(self) -> list[Member]:
        nodes: list[Member] = list(self.nodes.values())
        return [self.embedded, *nodes] if self.embedded is not None else nodes

    # Backend ------------------------------------------------------------------------------------
    def fingerprint(self) -> str:
        return self._fingerprint

    def chat(self, request: ChatCompletionRequest, ticket: Ticket) -> AsyncIterator[Events]:
        return self._serve(request, self._members, lambda member: member.events(request, ticket))

    def complete(self, request: CompletionRequest, ticket: Ticket) -> AsyncIterator[Events]:
        return self._serve(request, self._members, lambda member: member.events(request, ticket))

    # Native relay -------------------------------------------------------------------------------
    def relays(self, api: NativeApi) -> bool:
        """Whether requests to `api` are relayed as sent: every member is a node that declares the API.

        All or nothing, so that one request's answer (and whether a node or the gateway stores a response)
        never depends on which member served it, and failover stays among members that answer alike."""
        nodes = list(self.nodes.values())
        return self.embedded is None and bool(nodes) and all(node.serves_natively(api) for node in nodes)

    def relay(self, request: NativeRequest, request_id: str) -> AsyncIterator[Events]:
        """The answer of a node that serves `request.api` itself: `Raw` pieces, then the usage; routed, failed
        over and timed as chat is (`native.py`). Nodes registered since `relays` was asked and do not declare
        the API are passed over."""
        return self._serve(request.chat, lambda: self._natives(request), lambda node: node.relay(request, request_id))

    async def fetch(self, node_name: str, method: str, path: str, request_id: str) -> tuple[int, bytes]:
        """The answer of the node `node_name` to a bodiless request (reads of what it keeps, such as a stored
        response); 502 when the node is gone or cannot be reached, since no other node holds it."""
        node = self.nodes.get(node_name)
        if node is None or node.retired:
            raise UpstreamError(f"The upstream node that keeps this object ({node_name}) is not serving this model.")
        try:
            return await node.fetch(method, path, request_id)
        except NodeFailure as exc:
            self._failed(node, exc)
            raise UpstreamError(f"The upstream node that keeps this object failed ({exc.reason}).") from None

    def _members(self) -> list[Member]:
        return self.members

    def _natives(self, request: NativeRequest) -> list[Node]:
        """The nodes that may answer: those that serve the API, or only the one a continued request must go to."""
        nodes = [node for node in self.nodes.values() if node.serves_natively(request.api)]
        return nodes if request.node is None else [node for node in nodes if node.name == request.node]

    async def count_chat_prompt(self, request: ChatCompletionRequest) -> PromptCount:
        """Exact with an embedded engine (the same model), or as a node's tokenizer endpoint counts it; otherwise
        an estimate (the ledger's, template tokens included), as when no node can be asked. The first node that
        answers decides: a model's nodes are expected to run the same server."""
        if self.embedded is not None:
            return await self.embedded.backend.count_chat_prompt(request)
        try:
            _, count = await self._first_answer(
                lambda: list(self.nodes.values()), lambda node: node.count_prompt(request)
            )
        except (UpstreamError, Overloaded):  # no node could answer: counting needs none
            return PromptCount(prompt_tokens(request, self.counter), estimated=True)
        return count

    async def count_natively(self, request: NativeRequest, request_id: str) -> int:
        """A node's own count of a request in an API it serves itself (Messages' `count_tokens`). No estimate
        stands in when no node answers: the client asked for the node's API, and gets its failure as a 5xx."""
        _, count = await self._first_answer(
            lambda: self._natives(request), lambda node: node.count_native(request, request_id)
        )
        return count

    async def embed(self, request: EmbeddingRequest, ticket: Ticket) -> Embeddings:
        """The first member's answer that comes; a member that fails is passed over for the next, as for chat."""
        member, result = await self._first_answer(
            lambda: self.members, lambda member: member.embed(request, ticket), timed=True
        )
        result.served_by = Served(member.name, member.kind)
        return result

    async def _first_answer(
        self, candidates: Callable[[], Sequence[M]], ask: Callable[[M], Awaitable[T]], timed: bool = False
    ) -> tuple[M, T]:
        """The first of `candidates` to answer `ask`, and its answer; one that fails is passed over for the next,
        as for chat. `timed`: the answer's time feeds the member's latency (a generation's does; a count's
        would only skew it)."""
        failures: list[NodeFailure] = []
        for number, member in enumerate(self._attempts(candidates, None)):
            started = time.monotonic()
            try:
                async with Attempt(self, member, number) as span:
                    with use_span(span):
                        result = await ask(member)
                    member.breaker.success()
            except NodeFailure as exc:
                failures.append(exc)
                continue
            if timed:
                member.load.observe_latency(time.monotonic() - started)
            return member, result
        raise exhausted(failures)

    async def start(self) -> None:
        if self.embedded is not None and not self.embedded.backend.ready():
            await self.embedded.backend.start()
        if self.routing.health.probe_interval > 0:
            self._prober = asyncio.create_task(self._probe_forever(), name=f"probe {self.card.id}")

    async def close(self) -> None:
        if self._prober is not None:
            self._prober.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._prober
        for member in self.members:
            await member.close()

    def ready(self) -> bool:
        # Nodes come and go (and register later); only an embedded engine still loading makes us unready.
        return self.embedded is None or self.embedded.backend.ready()

    def status(self) -> dict[str, object]:
        body: dict[str, object] = {
            "backend": self.kind,
            "ready": self.ready(),
            "nodes": [node.status() for node in self.nodes.values()],
        }
        if self.embedded is not None:
            body["embedded"] = self.embedded.status()
        return body

    # Routing and failover -----------------------------------------------------------------------
    async def _serve(
        self, request: Request, candidates: Callable[[], Sequence[M]], answer: Callable[[M], AsyncIterator[Events]]
    ) -> AsyncIterator[Events]:
        """The answer of the first of `candidates` (asked again at each attempt, as nodes come and go) that
        begins one; `answer` asks a member for its events."""
        key = affinity_key(request, self.routing.affinity)
        failures: list[NodeFailure] = []
        for number, member in enumerate(self._attempts(candidates, key)):
            # One member's answer, inline rather than a generator of its own (one layer less for every event):
            # `NodeFailure` before its first event passes the request on; after it, the stream is broken.
            started = time.monotonic()
            streaming = False
            try:
                async with Attempt(self, member, number) as span:
                    with use_span(span):  # the attempt's span is the parent the node is told of (`traceparent`)
                        events = answer(member)
                    try:
                        first: Events = await anext(events, [])
                        member.breaker.success()
                        member.load.observe_latency(time.monotonic() - started)
                        streaming = True
                        yield [Served(member.name, member.kind), *first]
                        async for batch in events:
                            yield batch
                    finally:
                        await aclose_quietly(events)
            except NodeFailure as exc:
                if streaming:
                    raise broken_stream(exc.reason) from None
                failures.append(exc)  # nothing has reached the client: another member may serve
                continue
            return
        raise exhausted(failures)

    def _attempts(self, candidates: Callable[[], Sequence[M]], key: int | None) -> Iterator[M]:
        """Members in the order routing picks them, each at most once and at most `max_attempts` in all;
        `candidates` is asked again at each attempt, as nodes come and go."""
        tried: set[str] = set()
        while len(tried) < self.routing.max_attempts:
            member = choose(candidates(), tried, key, self.routing.affinity)
            if member is None:
                return
            tried.add(member.name)
            yield member

    def _begin(self, member: Member) -> None:
        self._picks += 1
        member.load.last_pick = self._picks
        member.load.in_flight += 1
        member.load.requests += 1
        member.breaker.begin()

    def _failed(self, member: Member, failure: NodeFailure) -> None:
        log.warning("model %s: %s %s failed: %s", self.card.id, member.kind, member.name, failure.reason)
        member.breaker.failure()
        member.load.failures += 1
        member.last_error = failure.reason

    async def _end(self, member: Member) -> None:
        member.load.in_flight -= 1
        member.breaker.abandon()
        if member.retired and member.load.in_flight == 0:
            await member.close()

    async def _probe_forever(self) -> None:
        while True:
            await asyncio.gather(*(node.probe() for node in list(self.nodes.values())))
            await asyncio.sleep(self.routing.health.probe_interval)


class Attempt:
    """One try of a request on a member, as an `async with` block: counted in the member's load, its breaker and a
    span when traced. A `NodeFailure` out of the block counts against the member; an `APIError` is the request's
    own (the member answered, and is fine). A class rather than an `asynccontextmanager`: every request enters one,
    and a generator-based manager adds an async generator and its bookkeeping to each."""

    def __init__(self, backend: RoutedBackend, member: Member, number: int) -> None:
        self.backend = backend
        self.member = member
        self.number = number
        self.span: Span | None = None

    async def __aenter__(self) -> Span | None:
        self.backend._begin(self.member)
        self.span = attempt_span(self.backend.tracer, self.member, self.number)
        return self.span

    async def __aexit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: object) -> None:
        failure = exc if isinstance(exc, NodeFailure) else None
        if failure is not None:
            self.backend._failed(self.member, failure)
        elif isinstance(exc, APIError):
            self.member.breaker.success()
        end_attempt(self.span, failure)
        await self.backend._end(self.member)
