"""The flow both generation endpoints share: parse, route, run, observe, render as JSON or SSE."""

from __future__ import annotations

import functools
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, Protocol

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.types import Receive, Scope, Send

from tokenrelay.backends.base import Backend, Events, Ticket
from tokenrelay.backends.fallback import Candidate, naming
from tokenrelay.calls.record import Call, ClientGone, observed, record_failure
from tokenrelay.calls.request_ids import request_id_of
from tokenrelay.jsonbytes import dumps
from tokenrelay.openai.call_services import CallServices
from tokenrelay.openai.disconnect import cancel_on_disconnect
from tokenrelay.openai.parsing import parse_body
from tokenrelay.openai.render import Chunk, Collected, ResponseMeta, collect
from tokenrelay.openai.sse import OPENAI, EventStream, Framing, Piece
from tokenrelay.protocol.common import GenerationRequest


class Endpoint(Protocol):
    """What differs between `/v1/chat/completions` and `/v1/completions`."""

    name: str
    id_prefix: str
    request_model: type[GenerationRequest]

    def choices(self, body: Any) -> int: ...

    def meta_extra(self, body: Any) -> dict[str, Any]: ...

    def events(self, backend: Backend, body: Any, ticket: Ticket) -> AsyncIterator[Events]: ...

    def chunks(self, body: Any, meta: ResponseMeta, events: AsyncIterator[Events]) -> AsyncIterator[list[Chunk]]: ...

    def body(self, body: Any, meta: ResponseMeta, collected: Collected) -> dict[str, Any]: ...


# What a generation can answer with besides its result (the key check adds 401 and 503 in the document).
GENERATION_ERRORS = (400, 404, 413, 429, 502, 503)
# The model that served a call: on every answer, not only a fallback's, so clients need not tell the two apart.
SERVED_MODEL = b"x-tokenrelay-served-model"


async def handle(request: Request, endpoint: Endpoint) -> Response:
    return await run_call(request, endpoint.name, functools.partial(_generate, endpoint))


# What a call does once opened: parse, admit, run and answer (`run_call` reports it if this fails).
CallWork = Callable[[Request, Call, CallServices], Awaitable[Response]]


async def run_call(request: Request, endpoint_name: str, work: CallWork) -> Response:
    """Open the call's record, run `work` (given the request, the call and the services) and answer. The call ends,
    and is reported, exactly once: here if it fails before its response exists, else once its response is over
    (`Ending`), however that ends (sent, client gone, shutdown)."""
    services = request.app.state.services
    call = Call(request_id=request_id_of(request.scope), endpoint=endpoint_name, model="")
    services.begin_call(call, request)
    end = functools.partial(services.end_call, call)
    try:
        response = await work(request, call, services)
        response.raw_headers.append((SERVED_MODEL, (call.served_model or call.model).encode()))
    except ClientGone as exc:
        record_failure(call, exc)
        response = Response(status_code=499)  # nobody is listening; this only ends the ASGI exchange cleanly
    except BaseException as exc:
        record_failure(call, exc)
        end()
        raise
    return Ending(response, end)


class Ending(Response):
    """A call's response, which ends the call once it has been sent or sending failed."""

    def __init__(self, response: Response, end: Callable[[], None]) -> None:
        self.response = response
        self.end = end
        self.status_code = response.status_code
        self.background = None

    @property  # type: ignore[override]
    def raw_headers(self) -> list[tuple[bytes, bytes]]:
        return self.response.raw_headers

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await self.response(scope, receive, send)
        finally:
            self.end()
            if self.background is not None:  # what FastAPI hands a route's response (never used by calls)
                await self.background()


async def _generate(endpoint: Endpoint, request: Request, call: Call, services: CallServices) -> Response:
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
    naming(backend, functools.partial(_served_by, meta))
    events = observed(endpoint.events(backend, body, call.ticket), call)

    async def whole() -> dict[str, Any]:
        return endpoint.body(body, meta, await collect(events))

    return await stream_or_collect(request, bool(body.stream), lambda: endpoint.chunks(body, meta, events), whole)


def _served_by(meta: ResponseMeta, served: Candidate) -> None:
    meta.model, meta.system_fingerprint = served.model, served.backend.fingerprint()


async def stream_or_collect(
    request: Request,
    stream: bool,
    chunks: Callable[[], AsyncIterator[list[Piece]]],
    whole: Callable[[], Awaitable[Any]],
    framing: Framing[Piece] = OPENAI,
) -> Response:
    """The answer as a stream of `chunks()`, or as the JSON body `whole()` makes once the events are in (a client
    that leaves meanwhile cancels the generation)."""
    if stream:
        return await streamed(chunks(), framing)
    with cancel_on_disconnect(request.receive):
        return JSONBody(await whole())


async def streamed(chunks: AsyncIterator[list[Piece]], framing: Framing[Piece] = OPENAI) -> Response:
    """The stream's response once its first chunks are in. Errors raised before the first chunks (validation inside
    the backend, a full queue) keep their HTTP status; later ones become an SSE error event followed by [DONE]."""
    first = await anext(chunks, None)
    return EventStream(first, chunks, framing)


class JSONBody(JSONResponse):
    """A JSON answer, encoded with orjson; bytes are a node's JSON body, sent as they are."""

    def render(self, content: Any) -> bytes:
        return content if isinstance(content, bytes) else dumps(content)
