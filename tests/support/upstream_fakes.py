"""Fake upstream nodes: one aiohttp server on loopback, a path prefix per node, scripted answers."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import pytest
from aiohttp import web
from servers import free_port

from tokenrelay.backends.base import Event, Events, TextDelta, TextRun
from tokenrelay.backends.upstream.backend import RoutedBackend
from tokenrelay.config import RoutingSettings, UpstreamSettings
from tokenrelay.protocol.chat import ChatCompletionRequest
from tokenrelay.protocol.completions import CompletionRequest

# The async tests run on asyncio, the loop uvicorn serves tokenrelay on.
ON_ASYNCIO = [pytest.mark.anyio, pytest.mark.parametrize("anyio_backend", ["asyncio"])]

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
REFUSE = "refuse"  # a node name's handler that stands for a port nothing listens on


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


def event_stream(body: bytes) -> web.Response:
    return web.Response(body=body, headers={"Content-Type": "text/event-stream"})


def error(status: int, message: str, **fields: Any) -> web.Response:
    return web.json_response({"error": {"message": message, "type": "invalid_request_error", **fields}}, status=status)


def chat_body(text: str, usage: dict[str, int] | None = None, **message: Any) -> dict[str, Any]:
    choice = {"index": 0, "message": {"role": "assistant", "content": text, **message}, "finish_reason": "stop"}
    body: dict[str, Any] = {"id": "node-id", "object": "chat.completion", "choices": [choice]}
    if usage is not None:
        body["usage"] = usage
    return body


def answer(response: Callable[[], web.StreamResponse]) -> Handler:
    async def handler(request: web.Request) -> web.StreamResponse:
        return response()

    return handler


class Stream:
    """An event stream sent in parts with pauses; notes how far it got and whether the reader left early."""

    def __init__(self, parts: list[bytes], pause: float = 0.0, pauses: dict[int, float] | None = None) -> None:
        self.parts = parts
        self.pause = pause
        self.pauses = pauses or {}
        self.sent = 0
        self.abandoned = asyncio.Event()

    async def respond(self, request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        try:
            for number, part in enumerate(self.parts):
                await asyncio.sleep(self.pauses.get(number, self.pause))
                await response.write(part)
                self.sent += 1
            await response.write_eof()
        except (asyncio.CancelledError, ConnectionError):
            self.abandoned.set()
            raise
        return response


@dataclass(frozen=True)
class Seen:
    node: str
    method: str
    path: str  # with the query string, if any
    headers: dict[str, str]
    body: bytes

    def json(self) -> dict[str, Any]:
        return json.loads(self.body)


class FakeNodes:
    """Nodes at `http://127.0.0.1:<port>/<name>/v1`, each answering with its own handler."""

    def __init__(self) -> None:
        self.handlers: dict[str, Handler | str] = {}
        self.seen: list[Seen] = []
        self.backends: list[RoutedBackend] = []
        app = web.Application()
        app.router.add_route("*", "/{node}/v1/{path:.*}", self._handle)
        app.router.add_route("*", "/{node}/{path:.*}", self._handle)  # the server's root (tokenizer endpoints)
        # Handlers are cancelled when the client goes away, as a real node's generation would be.
        self.runner = web.AppRunner(app, handler_cancellation=True, access_log=None, shutdown_timeout=0.1)
        self.port = free_port()
        self.dead_port = free_port()

    async def start(self) -> None:
        await self.runner.setup()
        await web.TCPSite(self.runner, "127.0.0.1", self.port).start()

    async def stop(self) -> None:
        for backend in self.backends:
            await backend.close()
        await self.runner.cleanup()

    def on(self, name: str, handler: Handler | str) -> None:
        self.handlers[name] = handler

    def url(self, name: str) -> str:
        port = self.dead_port if self.handlers.get(name) == REFUSE else self.port
        return f"http://127.0.0.1:{port}/{name}/v1"

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        name = request.match_info["node"]
        body = await request.read()
        self.seen.append(Seen(name, request.method, request.path_qs, dict(request.headers), body))
        handler = self.handlers[name]
        assert callable(handler)
        return await handler(request)

    def hits(self, name: str) -> int:
        return sum(1 for seen in self.seen if seen.node == name)

    def bodies(self, name: str) -> list[dict[str, Any]]:
        return [seen.json() for seen in self.seen if seen.node == name and seen.method == "POST"]

    def backend(self, *names: str, routing: RoutingSettings | None = None, **node: Any) -> RoutedBackend:
        upstreams = [UpstreamSettings(url=self.url(n), name=n, **node) for n in names]
        backend = RoutedBackend("m", routing or RoutingSettings(), upstreams)
        self.backends.append(backend)
        return backend


def nodes_fixture() -> Any:
    """The `nodes` fixture, for a test module to bind: `nodes = nodes_fixture()`."""

    @pytest.fixture
    async def nodes() -> AsyncIterator[FakeNodes]:
        fake = FakeNodes()
        await fake.start()
        try:
            yield fake
        finally:
            await fake.stop()

    return nodes


def chat(content: str = "hi", **fields: Any) -> ChatCompletionRequest:
    body = {"model": "m", "messages": [{"role": "user", "content": content}], **fields}
    return ChatCompletionRequest.model_validate_json(json.dumps(body), strict=True)


def completion(prompt: Any = "Once", **fields: Any) -> CompletionRequest:
    return CompletionRequest.model_validate_json(json.dumps({"model": "m", "prompt": prompt, **fields}), strict=True)


async def drain(batches: AsyncIterator[Events]) -> list[Event]:
    """Every event of a backend's answer, in order, however they were batched."""
    return [event async for events in batches for event in events]


def text_of(events: list[Event]) -> str:
    """The text the events carry, whether one delta at a time or in runs (the chunks of one read)."""
    parts = [
        e.text if isinstance(e, TextDelta) else "".join(e.texts) for e in events if isinstance(e, TextDelta | TextRun)
    ]
    return "".join(parts)
