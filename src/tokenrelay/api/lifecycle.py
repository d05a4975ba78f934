"""The one lifecycle of an API call, whatever its dialect: open the call's record, run the endpoint's work, answer
with a JSON body or an event stream, and end the call exactly once."""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.types import Receive, Scope, Send

from tokenrelay.api.disconnect import cancel_on_disconnect
from tokenrelay.api.ignored import ignored_header
from tokenrelay.api.server import Server, services_of
from tokenrelay.api.sse import EventStream, Framing, Piece
from tokenrelay.calls.record import Call, ClientGone, record_failure
from tokenrelay.calls.request_ids import request_id_of
from tokenrelay.jsonbytes import dumps

# The model that served a call: on every answer, not only a fallback's, so clients need not tell the two apart.
SERVED_MODEL = b"x-tokenrelay-served-model"

# What a call does once opened: parse, admit, run and answer (`run_call` reports it if this fails).
CallWork = Callable[[Request, Call, Server], Awaitable[Response]]


async def run_call(request: Request, endpoint_name: str, work: CallWork) -> Response:
    """Open the call's record, run `work` (given the request, the call and the services) and answer. The call ends,
    and is reported, exactly once: here if it fails before its response exists, else once its response is over
    (`Ending`), however that ends (sent, client gone, shutdown)."""
    services = services_of(request)
    call = Call(request_id=request_id_of(request.scope), endpoint=endpoint_name, model="")
    services.begin_call(call, request)
    end = functools.partial(services.end_call, call)
    try:
        response = await work(request, call, services)
        response.raw_headers.append((SERVED_MODEL, (call.served_model or call.model).encode()))
        if call.ignored:
            response.raw_headers.append(ignored_header(call.ignored))
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

    @property  # the wrapped response's headers themselves, not a copy of them
    def raw_headers(self) -> list[tuple[bytes, bytes]]:
        return self.response.raw_headers

    @raw_headers.setter
    def raw_headers(self, headers: list[tuple[bytes, bytes]]) -> None:
        self.response.raw_headers = headers

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await self.response(scope, receive, send)
        finally:
            self.end()
            if self.background is not None:  # what FastAPI hands a route's response (never used by calls)
                await self.background()


async def stream_or_collect(
    request: Request,
    stream: bool,
    chunks: Callable[[], AsyncIterator[list[Piece]]],
    whole: Callable[[], Awaitable[Any]],
    framing: Framing[Piece],
) -> Response:
    """The answer as a stream of `chunks()`, or as the JSON body `whole()` makes once the events are in (a client
    that leaves meanwhile cancels the generation)."""
    if stream:
        return await streamed(chunks(), framing, request.receive)
    with cancel_on_disconnect(request.receive):
        return JSONBody(await whole())


async def streamed(chunks: AsyncIterator[list[Piece]], framing: Framing[Piece], receive: Receive) -> Response:
    """The stream's response once its first chunks are in. Errors raised before the first chunks (validation inside
    the backend, a full queue) keep their HTTP status; later ones become an SSE error event followed by [DONE]. A
    client that leaves before them (during a long prompt) cancels the generation, as one waiting for JSON does."""
    with cancel_on_disconnect(receive):
        first = await anext(chunks, None)
    return EventStream(first, chunks, framing)


class JSONBody(JSONResponse):
    """A JSON answer, encoded with orjson; bytes are a node's JSON body, sent as they are."""

    def render(self, content: Any) -> bytes:
        return content if isinstance(content, bytes) else dumps(content)
