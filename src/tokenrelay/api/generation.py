"""The flow both generation endpoints share: parse, route, run, observe, render as JSON or SSE."""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import AsyncIterator, Callable
from typing import Any, Protocol

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.types import Receive, Scope, Send

from tokenrelay.api.parsing import parse_body
from tokenrelay.backends.base import Backend, Event
from tokenrelay.calls import Call, ClientGone, current_call, observed, record_failure
from tokenrelay.deadlines import Deadlines
from tokenrelay.disconnect import DisconnectWatch
from tokenrelay.jsonbytes import dumps
from tokenrelay.outbox import Outbox, current_outbox
from tokenrelay.protocol.common import GenerationRequest
from tokenrelay.render.common import Chunk, Collected, ResponseMeta, collect
from tokenrelay.requestid import request_id_of
from tokenrelay.sse import EventStream


class Endpoint(Protocol):
    """What differs between `/v1/chat/completions` and `/v1/completions`."""

    name: str
    id_prefix: str
    request_model: type[GenerationRequest]

    def choices(self, body: Any) -> int: ...

    def meta_extra(self, body: Any) -> dict[str, Any]: ...

    def events(self, backend: Backend, body: Any, request_id: str) -> AsyncIterator[Event]: ...

    def chunks(self, body: Any, meta: ResponseMeta, events: AsyncIterator[Event]) -> AsyncIterator[Chunk]: ...

    def body(self, body: Any, meta: ResponseMeta, collected: Collected) -> dict[str, Any]: ...


async def handle(request: Request, endpoint: Endpoint) -> Response:
    services = request.app.state.services
    call = Call(request_id=request_id_of(request.scope), endpoint=endpoint.name, model="")
    current_call.set(call)
    services.begin_call(call, request)
    try:
        body = await parse_body(request, endpoint.request_model, services.settings.max_n)
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
        # An answer is reported once its last bytes are handed to the server (`ReportedResponse`, `EventStream`'s
        # `report`), so they leave before its log line, metrics and ledger row are made. A stream reported as its
        # events ended had them made first: its last write waited for them.
        events = observed(endpoint.events(backend, body, call.request_id), call)
        report = functools.partial(services.end_call, call)
        if body.stream:
            return await streamed(endpoint.chunks(body, meta, events), services.deadlines, report)
        answer = endpoint.body(body, meta, await collected(request, events, services.deadlines))
        return ReportedResponse(answer, report=report)
    except ClientGone as exc:
        record_failure(call, exc)
        services.end_call(call)
        return Response(status_code=499)  # nobody is listening; this only ends the ASGI exchange cleanly
    except BaseException as exc:
        record_failure(call, exc)
        services.end_call(call)
        raise


async def streamed(chunks: AsyncIterator[Chunk], deadlines: Deadlines, report: Callable[[], None]) -> Response:
    """The stream's response once its first chunk is in; `report` is called once its last bytes are out (or
    sending failed). Errors raised before the first chunk (validation inside the backend, a full queue) keep
    their HTTP status, and are the caller's to report; later ones become an SSE error event followed by [DONE]."""
    outbox = Outbox()
    current_outbox.set(outbox)  # before the backend starts: a paced producer finds it (see `tokenrelay.outbox`)
    first = await anext(chunks, None)
    return EventStream(chunks, first, outbox, deadlines, report)


class ReportedResponse(JSONResponse):
    """A JSON answer that reports its call once sent, or once sending failed (so no call goes unrecorded)."""

    def __init__(self, content: Any, report: Callable[[], None]) -> None:
        super().__init__(content)
        self._report = report

    def render(self, content: Any) -> bytes:
        return dumps(content)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._report()


async def collected(request: Request, events: AsyncIterator[Event], deadlines: Deadlines) -> Collected:
    """Gather a non-streamed response, abandoning the generation if the client goes away."""
    with DisconnectWatch(request.receive, deadlines) as watch:
        try:
            return await collect(events)
        except asyncio.CancelledError:
            if watch.gone():  # a shutdown's cancellation stays a cancellation
                raise ClientGone from None
            raise
