"""The flow both generation endpoints share: parse, route, run, observe, render as JSON or SSE."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any, Protocol

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from tokenrelay.api.parsing import parse_body
from tokenrelay.backends.base import Backend, Event
from tokenrelay.calls import Call, ClientGone, current_call, observed, record_failure
from tokenrelay.protocol.common import GenerationRequest
from tokenrelay.render.common import Collected, ResponseMeta, collect
from tokenrelay.sse import stream_response


class Endpoint(Protocol):
    """What differs between `/v1/chat/completions` and `/v1/completions`."""

    name: str
    id_prefix: str
    request_model: type[GenerationRequest]

    def choices(self, body: Any) -> int: ...

    def meta_extra(self, body: Any) -> dict[str, Any]: ...

    def events(self, backend: Backend, body: Any, request_id: str) -> AsyncIterator[Event]: ...

    def chunks(self, body: Any, meta: ResponseMeta, events: AsyncIterator[Event]) -> AsyncIterator[dict[str, Any]]: ...

    def body(self, body: Any, meta: ResponseMeta, collected: Collected) -> dict[str, Any]: ...


async def handle(request: Request, endpoint: Endpoint) -> Response:
    services = request.app.state.services
    call = Call(request_id=request.state.request_id, endpoint=endpoint.name, model="")
    current_call.set(call)
    services.begin_call(call, request)
    try:
        body = await parse_body(request, endpoint.request_model, services.settings.max_n)
        call.model, call.streamed, call.user = body.model, bool(body.stream), body.user
        await services.admit(call, body)
        backend = services.registry.get(body.model)
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
        events = observed(endpoint.events(backend, body, call.request_id), call, services.end_call)
        if body.stream:
            return await streamed(request, endpoint.chunks(body, meta, events))
        return JSONResponse(endpoint.body(body, meta, await collected(request, events)))
    except ClientGone as exc:
        record_failure(call, exc)
        services.end_call(call)
        return Response(status_code=499)  # nobody is listening; this only ends the ASGI exchange cleanly
    except BaseException as exc:
        record_failure(call, exc)
        services.end_call(call)
        raise


async def streamed(request: Request, chunks: AsyncIterator[dict[str, Any]]) -> Response:
    # Errors raised before the first chunk (validation inside the backend, a full queue) keep their HTTP
    # status; later ones become an SSE error event followed by [DONE].
    first = await anext(chunks, None)
    return await stream_response(chunks, first, {"X-Request-ID": request.state.request_id})


async def collected(request: Request, events: AsyncIterator[Event]) -> Collected:
    """Gather a non-streamed response, abandoning the generation if the client goes away."""
    work = asyncio.ensure_future(collect(events))
    gone = asyncio.ensure_future(_disconnected(request))
    try:
        await asyncio.wait({work, gone}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        gone.cancel()
        if not work.done():
            work.cancel()
            await asyncio.gather(work, return_exceptions=True)
    if work.cancelled():
        raise ClientGone
    return work.result()


async def _disconnected(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass
