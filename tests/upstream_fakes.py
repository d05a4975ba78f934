"""Fake upstream nodes behind httpx's MockTransport: scripted answers, recorded requests, no sockets."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest

from tokenrelay.backends.base import Event
from tokenrelay.backends.upstream.backend import RoutedBackend
from tokenrelay.config import RoutingSettings, UpstreamSettings
from tokenrelay.protocol.chat import ChatCompletionRequest
from tokenrelay.protocol.completions import CompletionRequest

# The async tests run on asyncio, the loop uvicorn serves tokenrelay on.
ON_ASYNCIO = [pytest.mark.anyio, pytest.mark.parametrize("anyio_backend", ["asyncio"])]

Handler = Callable[[httpx.Request], Awaitable[httpx.Response]]


def chunk(text: str | None = None, *, finish: str | None = None, index: int = 0, **delta: Any) -> dict[str, Any]:
    if text is not None:
        delta["content"] = text
    choice = {"index": index, "delta": delta, "finish_reason": finish}
    return {"id": "node-id", "object": "chat.completion.chunk", "model": "node-model", "choices": [choice]}


def usage_chunk(prompt: int, completion: int, cached: int = 0) -> dict[str, Any]:
    usage = {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}
    return {"id": "node-id", "choices": [], "usage": usage | {"prompt_tokens_details": {"cached_tokens": cached}}}


def sse(*chunks: dict[str, Any] | str, done: bool = True) -> bytes:
    frames = [c if isinstance(c, str) else f"data: {json.dumps(c)}\n\n" for c in chunks]
    return ("".join(frames) + ("data: [DONE]\n\n" if done else "")).encode()


class Stream(httpx.AsyncByteStream):
    """A response body sent in parts, with pauses; remembers whether the reader closed it early."""

    def __init__(self, parts: list[bytes], pause: float = 0.0, pauses: dict[int, float] | None = None) -> None:
        self.parts = parts
        self.pause = pause
        self.pauses = pauses or {}
        self.sent = 0
        self.closed = asyncio.Event()

    async def __aiter__(self) -> AsyncIterator[bytes]:
        for number, part in enumerate(self.parts):
            await asyncio.sleep(self.pauses.get(number, self.pause))
            self.sent += 1
            yield part

    async def aclose(self) -> None:
        self.closed.set()


def event_stream(body: bytes | Stream, status: int = 200) -> httpx.Response:
    stream = body if isinstance(body, Stream) else Stream([body])
    return httpx.Response(status, headers={"content-type": "text/event-stream"}, stream=stream)


def error(status: int, message: str, **fields: Any) -> httpx.Response:
    return httpx.Response(status, json={"error": {"message": message, "type": "invalid_request_error", **fields}})


def chat_body(text: str, usage: dict[str, int] | None = None, **message: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "id": "node-id",
        "object": "chat.completion",
        "choices": [
            {"index": 0, "message": {"role": "assistant", "content": text, **message}, "finish_reason": "stop"}
        ],
    }
    if usage is not None:
        body["usage"] = usage
    return body


@dataclass
class FakeNodes:
    """Nodes `http://<name>.test/v1`, each answering with its own handler (or raising a transport error)."""

    handlers: dict[str, Handler] = field(default_factory=dict)
    seen: list[tuple[str, httpx.Request]] = field(default_factory=list)

    def on(self, name: str, handler: Handler) -> None:
        self.handlers[name] = handler

    async def handle(self, request: httpx.Request) -> httpx.Response:
        name = request.url.host.removesuffix(".test")
        self.seen.append((name, request))
        return await self.handlers[name](request)

    def hits(self, name: str) -> int:
        return sum(1 for who, _ in self.seen if who == name)

    def bodies(self, name: str) -> list[dict[str, Any]]:
        return [json.loads(r.content) for who, r in self.seen if who == name and r.method == "POST"]

    def backend(self, *names: str, routing: RoutingSettings | None = None, **node: Any) -> RoutedBackend:
        upstreams = [UpstreamSettings(url=f"http://{n}.test/v1", name=n, **node) for n in names]
        return RoutedBackend("m", routing or RoutingSettings(), upstreams, transport=httpx.MockTransport(self.handle))


def answer(response: httpx.Response | Callable[[], httpx.Response]) -> Handler:
    async def handler(request: httpx.Request) -> httpx.Response:
        return response() if callable(response) else response

    return handler


def refuse_connection() -> Handler:
    async def handler(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("connection refused", request=request)

    return handler


def chat(content: str = "hi", **fields: Any) -> ChatCompletionRequest:
    body = {"model": "m", "messages": [{"role": "user", "content": content}], **fields}
    return ChatCompletionRequest.model_validate_json(json.dumps(body), strict=True)


def completion(prompt: Any = "Once", **fields: Any) -> CompletionRequest:
    return CompletionRequest.model_validate_json(json.dumps({"model": "m", "prompt": prompt, **fields}), strict=True)


async def drain(events: AsyncIterator[Event]) -> list[Event]:
    return [event async for event in events]
