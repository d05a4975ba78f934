"""Native relay: a Responses or Messages request sent to a node that serves that API itself, as the client sent it.

The node gets the client's JSON body with only `model` rewritten, and its answer goes back byte for byte: a
stream's pieces as they arrive (event names, sequence numbers and all), a whole body as it came. The exchange
keeps the chat relay's rules (`relay.py`): the same clock (`first_byte` until the first event, `idle` between
events, keep-alive comments not counting, `overall` for all), the same failures, so the routed backend fails
over before the first event and the breaker counts them. Bytes that hold no event yet (keep-alive comments) are
held back until the first event, so that failover stays possible until the answer has really begun.

What differs from chat: a node's 404 that names a request field other than `model` (the continued response
of `previous_response_id`) concerns what the client sent, so it reaches the client instead of counting
against the node's configuration; and a response object's `"error": null` is no error.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

from tokenrelay.backends.base import Events, NativeRequest, Raw
from tokenrelay.backends.upstream.client import NodeClient
from tokenrelay.backends.upstream.failures import NodeFailure, NodeRejection, failure_for_status, node_error
from tokenrelay.backends.upstream.native_usage import AnswerReader
from tokenrelay.backends.upstream.relay import Clock, check_status, is_event_stream, next_chunk, read_all, send
from tokenrelay.backends.upstream.sse_parse import SSEDecoder
from tokenrelay.backends.upstream.transport import NodeReply
from tokenrelay.config import UpstreamTimeouts

__all__ = ["native_relay"]


async def native_relay(
    client: NodeClient,
    request: NativeRequest,
    node_model: str,
    headers: dict[str, str],
    timeouts: UpstreamTimeouts,
    reader: AnswerReader,
) -> AsyncIterator[Events]:
    """The node's answer as `Raw` pieces (a batch per read), the usage last (the node's or `reader`'s estimate),
    also when the node fails once some bytes have gone out."""
    clock = Clock(timeouts)
    stage = clock.bound(clock.first_byte if request.stream else clock.overall, "waiting for the node")
    response = await send(client, request.path, request.payload(node_model), headers, stage)
    started = False
    try:
        await check_status(response, clock, classify)
        if is_event_stream(response) != request.stream:
            raise NodeFailure("the node answered a stream with a body, or a body with a stream")
        if request.stream:
            async for piece in _stream(response, clock, reader):
                started = True
                yield [*reader.stored(), Raw(piece)]
        else:
            content = await read_all(response, clock.bound(clock.overall, "reading the answer"))
            reader.body(content)
            started = True
            yield [*reader.stored(), Raw(content)]
    except NodeFailure:
        if started:
            yield [reader.usage()]
        raise
    finally:
        response.release()  # an answer left mid-way closes its connection, which tells the node to stop
    yield [reader.usage()]


async def _stream(response: NodeReply, clock: Clock, reader: AnswerReader) -> AsyncIterator[bytes]:
    """The stream's pieces as they arrive, from the first that completes an event; failures are raised after
    the pieces before them went out."""
    decoder = SSEDecoder()
    stage = clock.bound(clock.first_byte, "before the first event")
    held = b""  # bytes before the first event (keep-alive comments)
    started = False
    while True:
        piece = await next_chunk(response, stage)
        messages = decoder.feed(piece) if piece is not None else decoder.close()
        if messages:  # progress: the next event is due within the idle gap
            stage = clock.bound(clock.next_gap(), "between events")
        reader.events(messages, first=not started)
        if piece is None:
            break
        if not started:
            if not messages:
                held += piece
                continue
            piece, held, started = held + piece, b"", True
        yield piece
    if not reader.finished:
        raise NodeFailure("the node's stream ended before its last event")


def classify(status: int, content: bytes) -> NodeFailure | NodeRejection:
    """The chat relay's reading of a node's status, except for a 404 about a field of the client's request."""
    failure = failure_for_status(status, content)
    if status == 404 and isinstance(failure, NodeFailure):
        error = node_error(content, status)
        if error.get("param") not in (None, "model"):
            return NodeRejection(status, error)
    return failure
