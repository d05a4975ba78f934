"""One exchange with one node: send the body, check the answer, turn it into events as it arrives.

Streams are relayed event by event as bytes arrive, never buffered whole. Time limits are enforced here
rather than by the HTTP client, because keep-alive comments must not count as progress: the first event
must come within `first_byte` of sending, each next one within `idle` of the last, and all within `overall`.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

from tokenrelay.backends.base import Event, Events
from tokenrelay.backends.upstream.client import NodeClient
from tokenrelay.backends.upstream.failures import NodeFailure, NodeRejection, failure_for_status, node_error
from tokenrelay.backends.upstream.metering import Meter
from tokenrelay.backends.upstream.sse_parse import SSEDecoder, SSEMessage
from tokenrelay.backends.upstream.transport import ConnectFailed, NodeReply, ReadTimeout, TransportError
from tokenrelay.backends.upstream.wire import coalesced, usage_of
from tokenrelay.config import UpstreamTimeouts
from tokenrelay.jsonbytes import dumps, loads

log = logging.getLogger(__name__)

_MAX_REASON = 300
Parser = Callable[[dict[str, Any], str], list[Event]]  # (chunk or body, "delta" | "message") → events


@dataclass(frozen=True, slots=True)
class Exchange:
    path: str  # relative to the node's URL, e.g. "/chat/completions"
    body: dict[str, Any]
    parse: Parser

    @property
    def stream(self) -> bool:
        return bool(self.body.get("stream"))


Stage = tuple[float, str]  # a deadline and what is awaited by then (for the failure's reason)


class Clock:
    """The limits of one exchange, as loop-time deadlines (each stage's deadline, capped by the overall one)."""

    def __init__(self, timeouts: UpstreamTimeouts) -> None:
        self.timeouts = timeouts
        self.now = asyncio.get_running_loop().time
        start = self.now()
        self.overall = start + timeouts.overall
        self.first_byte = start + timeouts.first_byte

    def bound(self, deadline: float, what: str) -> Stage:
        if self.overall < deadline:
            return self.overall, f"{what} (overall limit)"
        return deadline, what

    def next_gap(self) -> float:
        return self.now() + self.timeouts.idle


async def relay(
    client: NodeClient, exchange: Exchange, headers: dict[str, str], timeouts: UpstreamTimeouts, meter: Meter
) -> AsyncIterator[Events]:
    """The node's events, a batch per read, with the usage last: the node's own, or `meter`'s estimate; also
    when the node fails once some events have gone out (the ledger records what was sent)."""
    clock = Clock(timeouts)
    payload = dumps(exchange.body)
    stage = clock.bound(clock.first_byte if exchange.stream else clock.overall, "waiting for the node")
    response = await send(client, exchange.path, payload, headers, stage)
    started = False
    try:
        await check_status(response, clock)
        if exchange.stream and is_event_stream(response):
            reads = StreamReads(exchange.parse, clock)
            while not reads.over and not meter.done:
                events, failure = reads.feed(await next_chunk(response, reads.stage))
                passed = meter.passed(events)
                if passed:
                    started = True
                    yield passed
                if failure is not None:
                    raise failure
        else:  # a whole body, also when a node ignored `stream`
            body = await _read_json(response, clock.bound(clock.overall, "reading the answer"))
            passed = meter.passed(_body_events(body, exchange.parse, "message"), whole=True)
            if passed:
                started = True
                yield passed
    except NodeFailure:
        if started:
            yield [meter.usage()]
        raise
    finally:
        # Back to the pool when read to the end; the connection of an answer left mid-way (client gone,
        # timeout, broken stream) is closed, which is also what tells the node to stop generating.
        response.release()
    yield [meter.usage()]


async def exchange_json(
    client: NodeClient, path: str, body: dict[str, Any], headers: dict[str, str], timeouts: UpstreamTimeouts
) -> dict[str, Any]:
    """One non-streamed exchange (`/embeddings`): the node's JSON answer, within `overall`; the same failures
    as `relay` (a `NodeFailure` to try another node, a node's own 4xx relayed as it is)."""
    clock = Clock(timeouts)
    response = await send(client, path, dumps(body), headers, clock.bound(clock.overall, "waiting for the node"))
    try:
        await check_status(response, clock)
        answer = await _read_json(response, clock.bound(clock.overall, "reading the answer"))
    finally:
        response.release()
    if "error" in answer and "data" not in answer:
        raise reported_error(json.dumps(answer).encode())
    return answer


async def send(client: NodeClient, path: str, payload: bytes, headers: dict[str, str], stage: Stage) -> NodeReply:
    try:
        return await client.post(path, payload, headers, stage[0])
    except TransportError as exc:
        raise _transport_failure(exc, stage) from None


async def fetch(
    client: NodeClient,
    method: str,
    path: str,
    headers: dict[str, str],
    timeouts: UpstreamTimeouts,
    body: dict[str, Any] | None = None,
) -> tuple[int, bytes]:
    """One plain exchange (a stored object read or deleted, a tokenizer asked): the node's status and whole
    answer, within `overall`, whatever the status; a `NodeFailure` when the node cannot be reached."""
    clock = Clock(timeouts)
    stage = clock.bound(clock.overall, "waiting for the node")
    payload = b"" if body is None else dumps(body)
    try:
        response = await client.request(method, path, headers, stage[0], payload)
    except TransportError as exc:
        raise _transport_failure(exc, stage) from None
    try:
        return response.status, await read_all(response, stage)
    finally:
        response.release()


def _transport_failure(exc: TransportError, stage: Stage) -> NodeFailure:
    if isinstance(exc, ReadTimeout):
        return NodeFailure(f"timeout {stage[1]}")
    log.info("node connection error: %s", exc)
    return NodeFailure("connection failed" if isinstance(exc, ConnectFailed) else "connection lost")


Classifier = Callable[[int, bytes], NodeFailure | NodeRejection]  # a node's non-2xx status and body → the failure


async def check_status(response: NodeReply, clock: Clock, classify: Classifier = failure_for_status) -> None:
    if 200 <= response.status < 300:
        return
    content = await read_all(response, clock.bound(clock.overall, "reading the node's error"))
    failure = classify(response.status, content)
    if isinstance(failure, NodeFailure):
        log.warning("node answered %s: %s", response.status, node_error(content, response.status).get("message"))
    raise failure


async def read_all(response: NodeReply, stage: Stage) -> bytes:
    try:
        return await response.read(stage[0])
    except TransportError as exc:
        raise _transport_failure(exc, stage) from None


async def _read_json(response: NodeReply, stage: Stage) -> dict[str, Any]:
    return json_object(await read_all(response, stage))


def json_object(content: bytes) -> dict[str, Any]:
    """A node's whole answer as a JSON object; anything else is the node's failure."""
    try:
        body = loads(content)
    except ValueError:
        raise NodeFailure("the node's answer is not JSON") from None
    if not isinstance(body, dict):
        raise NodeFailure("the node's answer is not a JSON object")
    return body


def _body_events(body: dict[str, Any], parse: Parser, key: str) -> list[Event]:
    if "error" in body and "choices" not in body:
        raise reported_error(json.dumps(body).encode())
    events = parse(body, key)
    usage = usage_of(body)
    return [*events, usage] if usage is not None else events


def is_event_stream(response: NodeReply) -> bool:
    return response.content_type == "text/event-stream"


class StreamReads:
    """A node's stream, read by read: its decoder and the next read's deadline."""

    def __init__(self, parse: Parser, clock: Clock) -> None:
        self.parse = parse
        self.decoder = SSEDecoder()
        self.clock = clock
        self.stage = clock.bound(clock.first_byte, "before the first chunk")  # the next read's deadline
        self.over = False  # [DONE] came, or the body ended

    def feed(self, chunk: bytes | None) -> tuple[list[Event], NodeFailure | None]:
        """The events of one read (`chunk`; None at the body's end), and the failure to raise once they have
        gone out, if a chunk of it was bad."""
        messages = self.decoder.feed(chunk) if chunk is not None else self.decoder.close()
        events: list[Event] = []
        done = got = False
        failure: NodeFailure | None = None
        try:
            done, got = _read_messages(messages, self.parse, events)
        except NodeFailure as exc:
            failure, got = exc, True
        if got:  # the next chunk is due within the idle gap of this read's last one
            self.stage = self.clock.bound(self.clock.next_gap(), "between chunks")
        self.over = done or chunk is None
        return coalesced(events), failure


async def next_chunk(response: NodeReply, stage: Stage) -> bytes | None:
    try:
        return await response.next_piece(stage[0])
    except TransportError as exc:
        raise _transport_failure(exc, stage) from None


def _read_messages(messages: list[SSEMessage], parse: Parser, events: list[Event]) -> tuple[bool, bool]:
    """Add the events of one read's messages to `events` (so that those before a bad chunk still go out when
    it raises `NodeFailure`). Returns whether `[DONE]` came, and whether any chunk came before it."""
    got = False
    for message in messages:
        if message.data == b"[DONE]":
            # The answer is complete. Whatever follows is not waited for (the client's own [DONE] would wait
            # with it) nor judged: a node that breaks its framing after [DONE] has still answered. The body's
            # end usually came in the same read, and then the connection is reused.
            return True, got
        got = True
        events += _chunk_events(message, parse)
    return False, got


def _chunk_events(message: SSEMessage, parse: Parser) -> list[Event]:
    try:
        chunk = message.json()
    except ValueError:
        if not message.data.strip():  # an empty `data:` line, which says nothing
            return []
        raise NodeFailure("the node sent a chunk that is not JSON") from None
    if not isinstance(chunk, dict):
        raise NodeFailure("the node sent a chunk that is not a JSON object")
    if message.event == "error":
        raise reported_error(message.data)
    return _body_events(chunk, parse, "delta")


def reported_error(content: bytes) -> NodeFailure:
    """An error the node sent in place of an answer (or mid-stream); its message is the node's, kept short."""
    message = str(node_error(content, 200).get("message") or "unspecified")
    return NodeFailure(f"node error: {message[:_MAX_REASON]}")
