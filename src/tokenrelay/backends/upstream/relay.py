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

import orjson

from tokenrelay.backends.base import Event, TextDelta, TextRun
from tokenrelay.backends.upstream.chunk_template import ChunkTemplate, PlainText
from tokenrelay.backends.upstream.client import NodeClient
from tokenrelay.backends.upstream.failures import NodeFailure, failure_for_status, node_error
from tokenrelay.backends.upstream.http1 import ConnectFailed, ReadTimeout, Reply, TransportError
from tokenrelay.backends.upstream.metering import Meter
from tokenrelay.backends.upstream.sse_parse import Event as SSEEvent
from tokenrelay.backends.upstream.sse_parse import SSEDecoder, SSEMessage
from tokenrelay.backends.upstream.wire import coalesced, usage_of
from tokenrelay.config import UpstreamTimeouts
from tokenrelay.jsonbytes import dumps, loads, orjson_exact
from tokenrelay.outbox import current_outbox

log = logging.getLogger(__name__)

_MAX_REASON = 300
_DONE = b"[DONE]"
Parser = Callable[[dict[str, Any], str], list[Event]]  # (chunk or body, "delta" | "message") → events


@dataclass(slots=True)  # made per request: a frozen dataclass's __init__ costs 2.5x (object.__setattr__)
class Exchange:
    path: str  # relative to the node's URL, e.g. "/chat/completions"
    body: dict[str, Any]
    parse: Parser
    plain: PlainText | None = None  # how `parse` reads a plain chunk's text, when it does (`chunk_template`)

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
) -> AsyncIterator[Event]:
    """The node's events, with the usage last: the node's own, or `meter`'s estimate; also when the node
    fails once some events have gone out (the ledger records what was sent). The meter is applied here, to
    each read's events at once, rather than by a generator of its own around this one: one layer less for
    every event of every request to pass through."""
    clock = Clock(timeouts)
    payload = dumps(exchange.body)
    stage = clock.bound(clock.first_byte if exchange.stream else clock.overall, "waiting for the node")
    response = await _send(client, exchange.path, payload, headers, stage)
    started = False
    try:
        await _check_status(response, clock)
        if exchange.stream and _is_event_stream(response):
            # Read by read here, not through a generator of reads: one async generator fewer for every stream.
            reads = StreamReads(exchange, clock)
            outbox = current_outbox.get()
            while not reads.over:
                if outbox is not None:
                    await outbox.flush()  # what the last read became goes out in one write, before the next wait
                events, failure = reads.feed(await _next_chunk(response, reads.stage))
                if events:
                    if outbox is not None:
                        # Paced from this node's first event on: before it, a failure passes the request to
                        # another member (possibly the embedded engine, which never flushes), so nothing may
                        # be held for it.
                        outbox.paced = True
                    for event in meter.passed(events):
                        started = True
                        yield event
                if failure is not None:
                    raise failure
        else:  # a whole body, also when a node ignored `stream`
            body = await _read_json(response, clock.bound(clock.overall, "reading the answer"))
            for event in meter.passed(_body_events(body, exchange.parse, "message")):
                started = True
                yield event
    except NodeFailure:
        if started:
            yield meter.usage()
        raise
    finally:
        # Back to the pool when read to the end; the connection of an answer left mid-way (client gone,
        # timeout, broken stream) is closed, which is also what tells the node to stop generating.
        response.release()
    yield meter.usage()


async def _send(client: NodeClient, path: str, payload: bytes, headers: dict[str, str], stage: Stage) -> Reply:
    try:
        return await client.post(path, payload, headers, stage[0])
    except TransportError as exc:
        raise _transport_failure(exc, stage) from None


def _transport_failure(exc: TransportError, stage: Stage) -> NodeFailure:
    if isinstance(exc, ReadTimeout):
        return NodeFailure(f"timeout {stage[1]}")
    log.info("node connection error: %s", exc)
    return NodeFailure("connection failed" if isinstance(exc, ConnectFailed) else "connection lost")


async def _check_status(response: Reply, clock: Clock) -> None:
    if 200 <= response.status < 300:
        return
    content = await _read(response, clock.bound(clock.overall, "reading the node's error"))
    failure = failure_for_status(response.status, content)
    if isinstance(failure, NodeFailure):
        log.warning("node answered %s: %s", response.status, node_error(content, response.status).get("message"))
    raise failure


async def _read(response: Reply, stage: Stage) -> bytes:
    try:
        return await response.read(stage[0])
    except TransportError as exc:
        raise _transport_failure(exc, stage) from None


async def _read_json(response: Reply, stage: Stage) -> dict[str, Any]:
    content = await _read(response, stage)
    try:
        body = loads(content)
    except ValueError:
        raise NodeFailure("the node's answer is not JSON") from None
    if not isinstance(body, dict):
        raise NodeFailure("the node's answer is not a JSON object")
    return body


def _body_events(body: dict[str, Any], parse: Parser, key: str) -> list[Event]:
    if "error" in body and "choices" not in body:
        raise _reported_error(json.dumps(body).encode())
    events = parse(body, key)
    usage = usage_of(body)
    return [*events, usage] if usage is not None else events


def _is_event_stream(response: Reply) -> bool:
    return response.content_type == "text/event-stream"


class StreamReads:
    """A node's stream, read by read: its decoder, its learned chunk (`chunk_template`) and the next deadline."""

    __slots__ = ("clock", "decoder", "over", "parse", "stage", "template")

    def __init__(self, exchange: Exchange, clock: Clock) -> None:
        self.parse = exchange.parse
        self.template = ChunkTemplate(exchange.plain) if exchange.plain is not None else None
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
            done, got = _read_messages(messages, self.parse, events, self.template)
        except NodeFailure as exc:
            failure, got = exc, True
        if got:  # the next chunk is due within the idle gap of this read's last one
            self.stage = self.clock.bound(self.clock.next_gap(), "between chunks")
        self.over = done or chunk is None
        return coalesced(events), failure


async def _next_chunk(response: Reply, stage: Stage) -> bytes | None:
    try:
        return await response.next_piece(stage[0])
    except TransportError as exc:
        raise _transport_failure(exc, stage) from None


def _read_messages(
    messages: list[SSEEvent], parse: Parser, events: list[Event], template: ChunkTemplate | None
) -> tuple[bool, bool]:
    """Add the events of one read's messages to `events` (so that those before a bad chunk still go out when
    it raises `NodeFailure`). Returns whether `[DONE]` came, and whether any chunk came before it.

    With a `template` (chat streams) once learned, the chunks in a row that have its bytes at both ends are
    gathered and read together (`_plain_run`): all a stream's text chunks but the first, usually. Any other
    plain `data:` event goes to `_plain_message`, and the rest through `_chunk_events`."""
    got = False
    head, tail = _learned_ends(template)
    run: list[bytes] = []  # learned chunks in a row, not yet read
    for message in messages:
        if type(message) is bytes and head is not None and message.startswith(head) and message.endswith(tail):
            run.append(message)
            got = True
            continue
        if run:
            _plain_run(run, parse, events, template)  # type: ignore[arg-type]  # a run needs a learned template
            run = []
        if type(message) is bytes:
            if message == _DONE:
                return True, got
            got = True
            _plain_message(message, parse, events, template)
            if head is None:
                head, tail = _learned_ends(template)  # learned from this message, perhaps
            continue
        if message.data == "[DONE]":
            # The answer is complete. Whatever follows is not waited for (the client's own [DONE] would wait
            # with it) nor judged: a node that breaks its framing after [DONE] has still answered. The body's
            # end usually came in the same read, and then the connection is reused.
            return True, got
        got = True
        events += _chunk_events(message, parse)
    if run:
        _plain_run(run, parse, events, template)  # type: ignore[arg-type]
    return False, got


def _learned_ends(template: ChunkTemplate | None) -> tuple[bytes | None, bytes]:
    """The bytes a learned chunk starts and ends with (None while nothing is learned)."""
    return (None, b"") if template is None else (template.head, template.tail)


def _plain_run(run: list[bytes], parse: Parser, events: list[Event], template: ChunkTemplate) -> None:
    """Learned chunks in a row: one `TextRun` of their texts with the JSON strings as the node sent them, in
    one decoding for the lot (`ChunkTemplate.run`); chunk by chunk if that does not prove them (a middle
    that is not one string is read as any other message is)."""
    found = template.run(run)
    if found is not None:
        texts, encoded = found
        if texts:
            events.append(TextRun(template.index, texts, encoded))
        return
    for message in run:
        text = template.text(message)
        if text is None:
            _plain_message(message, parse, events, template)
        elif text:
            events.append(TextDelta(template.index, text))


def _plain_message(message: bytes, parse: Parser, events: list[Event], template: ChunkTemplate | None) -> None:
    """One plain `data:` event's bytes. Most hold a JSON object with neither usage nor an error, which goes
    from orjson straight to the parser (one Python call a chunk instead of four: `_chunk_events`, `loads`,
    `_body_events`, `usage_of`); anything else through `_chunk_events`. The first chunks of a chat stream
    teach the `template`."""
    if not orjson_exact(message):  # a number orjson would read otherwise (`jsonbytes`): `json`'s reading
        events += _chunk_events(message, parse)
        return
    try:
        chunk = orjson.loads(message)
    except orjson.JSONDecodeError:
        events += _chunk_events(message, parse)  # judged as before: `json`'s reading, or as text
        return
    if type(chunk) is dict and "usage" not in chunk and "error" not in chunk:
        events += parse(chunk, "delta")
        if template is not None and template.learning:
            template.learn(message, chunk)
    else:
        events += _object_events(chunk, parse)


def _chunk_events(message: SSEEvent, parse: Parser) -> list[Event]:
    if type(message) is bytes:  # the data of a plain `data:` event (see `sse_parse.Event`)
        try:
            chunk = loads(message)
        except ValueError:  # no JSON, or no UTF-8: judged as the line-by-line reading would
            return _chunk_events(SSEMessage(message.decode("utf-8", errors="replace")), parse)
    else:
        if not message.data.strip():
            return []
        try:
            chunk = loads(message.data)
        except ValueError:
            raise NodeFailure("the node sent a chunk that is not JSON") from None
        if message.event == "error" and isinstance(chunk, dict):
            raise _reported_error(message.data.encode())
    return _object_events(chunk, parse)


def _object_events(chunk: Any, parse: Parser) -> list[Event]:
    if not isinstance(chunk, dict):
        raise NodeFailure("the node sent a chunk that is not a JSON object")
    return _body_events(chunk, parse, "delta")


def _reported_error(content: bytes) -> NodeFailure:
    """An error the node sent in place of an answer (or mid-stream); its message is the node's, kept short."""
    message = str(node_error(content, 200).get("message") or "unspecified")
    return NodeFailure(f"node error: {message[:_MAX_REASON]}")
