"""The flow chat and completions share: parse, admit, run, observe, render as JSON or SSE (through the call
lifecycle of `api/lifecycle.py`)."""

from __future__ import annotations

import functools
import time
from collections.abc import AsyncIterator
from typing import Any, Protocol

from starlette.requests import Request
from starlette.responses import Response

from tokenrelay.api.collect import Chunk, Collected, collect
from tokenrelay.api.lifecycle import run_call, stream_or_collect
from tokenrelay.api.parsing import parse_body
from tokenrelay.api.server import Server
from tokenrelay.api.sse import OPENAI
from tokenrelay.backends.base import Backend, Events, Served, Ticket
from tokenrelay.calls.record import Call, observed
from tokenrelay.openai.render import ResponseMeta
from tokenrelay.protocol.common import GenerationRequest


class Endpoint(Protocol):
    """What differs between `/v1/chat/completions` and `/v1/completions`."""

    @property
    def name(self) -> str: ...

    @property
    def id_prefix(self) -> str: ...

    @property
    def request_model(self) -> type[GenerationRequest]: ...

    def choices(self, body: Any) -> int: ...

    def meta_extra(self, body: Any) -> dict[str, Any]: ...

    def events(self, backend: Backend, body: Any, ticket: Ticket) -> AsyncIterator[Events]: ...

    def chunks(self, body: Any, meta: ResponseMeta, events: AsyncIterator[Events]) -> AsyncIterator[list[Chunk]]: ...

    def body(self, body: Any, meta: ResponseMeta, collected: Collected) -> dict[str, Any]: ...


# What a generation can answer with besides its result (the key check adds 401 and 503 in the document).
GENERATION_ERRORS = (400, 404, 413, 429, 502, 503)


async def handle(request: Request, endpoint: Endpoint) -> Response:
    return await run_call(request, endpoint.name, functools.partial(_generate, endpoint))


async def _generate(endpoint: Endpoint, request: Request, call: Call, services: Server) -> Response:
    body = await parse_body(request, call, endpoint.request_model, services.settings.max_n)
    call.model, call.streamed, call.user = body.model, bool(body.stream), body.user
    backend = await services.admit(call, body)
    call.backend = backend.kind
    meta = ResponseMeta(
        id=f"{endpoint.id_prefix}-{call.request_id}",
        created=int(time.time()),
        model=body.model,
        system_fingerprint=backend.fingerprint(),
        choices=endpoint.choices(body),
        include_usage=body.include_usage,
        **endpoint.meta_extra(body),
    )
    call.on_served = functools.partial(_served_by, meta)
    events = observed(endpoint.events(backend, body, call.ticket), call)

    async def whole() -> dict[str, Any]:
        return endpoint.body(body, meta, await collect(events))

    chunks = functools.partial(endpoint.chunks, body, meta, events)
    return await stream_or_collect(request, bool(body.stream), chunks, whole, OPENAI)


def _served_by(meta: ResponseMeta, served: Served) -> None:
    meta.model = served.model or meta.model
    meta.system_fingerprint = served.fingerprint or meta.system_fingerprint
