"""One exchange with one node: send the body, check the answer, turn it into events as it arrives.

Streams are relayed event by event, never buffered. Server-sent events are decoded by `httpx-sse` (partial
lines, comments and keep-alives, CR/LF variants); a node that closes without `[DONE]` simply ends the
stream. Time limits are enforced here rather than by httpx's per-read timeout, because keep-alive comments
would reset that one while no chunk arrives: the first chunk must come within `first_byte`, each next one
within `idle`, and everything within `overall`.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import httpx
from httpx_sse import EventSource, ServerSentEvent

from tokenrelay.backends.base import Event
from tokenrelay.backends.upstream.failures import NodeFailure, failure_for_status, node_error
from tokenrelay.backends.upstream.wire import usage_of
from tokenrelay.config import UpstreamTimeouts

log = logging.getLogger(__name__)

T = TypeVar("T")
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


class Clock:
    """The limits of one exchange, as loop-time deadlines."""

    def __init__(self, timeouts: UpstreamTimeouts) -> None:
        self.timeouts = timeouts
        self.now = asyncio.get_running_loop().time
        start = self.now()
        self.overall = start + timeouts.overall
        self.first_byte = start + timeouts.first_byte

    def left(self, phase_deadline: float) -> float:
        return max(0.0, min(phase_deadline, self.overall) - self.now())

    def next_gap(self) -> float:
        return self.left(self.now() + self.timeouts.idle)


async def within(seconds: float, work: Awaitable[T], what: str) -> T:
    try:
        async with asyncio.timeout(seconds):
            return await work
    except TimeoutError:
        raise NodeFailure(f"timeout {what}") from None


async def relay(
    client: httpx.AsyncClient, exchange: Exchange, headers: dict[str, str], timeouts: UpstreamTimeouts
) -> AsyncIterator[Event]:
    clock = Clock(timeouts)
    request = client.build_request("POST", exchange.path, json=exchange.body, headers=headers)
    limit = clock.left(clock.first_byte if exchange.stream else clock.overall)
    response = await within(limit, _send(client, request), "waiting for the node to answer")
    try:
        await _check_status(response, clock)
        if exchange.stream and _is_event_stream(response):
            async for event in _stream_events(response, exchange.parse, clock):
                yield event
        else:  # a whole body, also when a node ignored `stream`
            body = await within(clock.left(clock.overall), _read_json(response), "reading the answer")
            for event in _body_events(body, exchange.parse, "message"):
                yield event
    finally:
        await response.aclose()


async def _send(client: httpx.AsyncClient, request: httpx.Request) -> httpx.Response:
    try:
        return await client.send(request, stream=True)
    except (httpx.ConnectError, httpx.ConnectTimeout):
        raise NodeFailure("connection failed") from None
    except httpx.TransportError as exc:
        raise NodeFailure(f"transport error ({type(exc).__name__})") from None


async def _check_status(response: httpx.Response, clock: Clock) -> None:
    if response.is_success:
        return
    content = await within(clock.left(clock.overall), _read(response), "reading the node's error")
    failure = failure_for_status(response.status_code, content)
    if isinstance(failure, NodeFailure):
        log.warning("node answered %s: %s", response.status_code, node_error(content, response.status_code))
    raise failure


async def _read(response: httpx.Response) -> bytes:
    try:
        return await response.aread()
    except httpx.TransportError as exc:
        raise NodeFailure(f"connection lost ({type(exc).__name__})") from None


async def _read_json(response: httpx.Response) -> dict[str, Any]:
    content = await _read(response)
    try:
        body = json.loads(content)
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


def _is_event_stream(response: httpx.Response) -> bool:
    return response.headers.get("content-type", "").partition(";")[0].strip() == "text/event-stream"


async def _stream_events(response: httpx.Response, parse: Parser, clock: Clock) -> AsyncIterator[Event]:
    sse = aiter(EventSource(response).aiter_sse())
    try:
        limit, what = clock.left(clock.first_byte), "before the first chunk"
        while True:
            message = await within(limit, _next_sse(sse), what)
            if message is None or message.data == "[DONE]":
                return
            limit, what = clock.next_gap(), "between chunks"
            for event in _chunk_events(message, parse):
                yield event
    finally:
        await sse.aclose()


async def _next_sse(sse: AsyncIterator[ServerSentEvent]) -> ServerSentEvent | None:
    try:
        return await anext(sse, None)
    except httpx.TransportError as exc:
        raise NodeFailure(f"connection lost ({type(exc).__name__})") from None


def _chunk_events(message: ServerSentEvent, parse: Parser) -> list[Event]:
    if not message.data.strip():
        return []
    try:
        chunk = json.loads(message.data)
    except ValueError:
        raise NodeFailure("the node sent a chunk that is not JSON") from None
    if not isinstance(chunk, dict):
        raise NodeFailure("the node sent a chunk that is not a JSON object")
    if message.event == "error":
        raise _reported_error(message.data.encode())
    return _body_events(chunk, parse, "delta")


def _reported_error(content: bytes) -> NodeFailure:
    """An error the node sent in place of an answer (or mid-stream); its message is the node's, kept short."""
    message = str(node_error(content, 200).get("message") or "unspecified")
    return NodeFailure(f"node error: {message[:_MAX_REASON]}")
