"""Answering with a node's own answer: a Responses or Messages request relayed natively (`backends/upstream/native.py`).

The endpoints parse, translate (for admission: the key's limits and budget see the same request as chat) and
admit as they always do; then, for a model whose nodes all serve the API themselves, the node's bytes go back
as they came: a stream through the same `EventStream` (disconnects cancel the exchange), a whole body as it
came; the call ends once the response does, as every call does (`api.lifecycle.run_call`). The call record
sees `Served`, `Raw` and the `Usage` the relay read from the answer, so ledger rows, metrics and the request
log are those of any other call.
"""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator, Awaitable, Callable

from starlette.requests import Request
from starlette.responses import Response

from tokenrelay.api.collect import Chunk
from tokenrelay.api.lifecycle import stream_or_collect
from tokenrelay.api.sse import RawFraming
from tokenrelay.backends.base import (
    Backend,
    Events,
    NativeApi,
    NativeRelay,
    NativeRequest,
    NodeStored,
    Raw,
    Served,
    aclose_quietly,
)
from tokenrelay.calls.record import Call, observed
from tokenrelay.errors import APIError, Overloaded

# Remembers what a node keeps: (the object's id, the node's name).
Keep = Callable[[str, str], Awaitable[None]]


def relays(backend: Backend, api: NativeApi) -> bool:
    """Whether `backend`'s requests to `api` go to its nodes as sent (every member declares the API)."""
    return isinstance(backend, NativeRelay) and backend.relays(api)


async def relayed_response(
    request: Request,
    call: Call,
    backend: Backend,
    native: NativeRequest,
    error_body: Callable[[APIError], Chunk],
    keep: Keep | None = None,
) -> Response:
    """The node's answer to the admitted `native` request; `error_body` writes a failure after the first byte
    as the API's `error` event; `keep` remembers what the node keeps, before the bytes that name it go out."""
    if not isinstance(backend, NativeRelay):  # the model's nodes went while it was admitted
        raise Overloaded("No upstream node is available for this model right now; retry later.")
    events = observed(backend.relay(native, call.request_id), call)

    async def whole() -> bytes:
        return b"".join([piece async for pieces in raw_pieces(events, keep) for piece in pieces])

    chunks = functools.partial(raw_pieces, events, keep)
    return await stream_or_collect(request, native.stream, chunks, whole, RawFraming(error_body))


async def raw_pieces(batches: AsyncIterator[Events], keep: Keep | None = None) -> AsyncIterator[list[bytes]]:
    """The node's bytes, a list per batch (one write each), without the batches that carry none; what the
    node keeps is remembered (`keep`) before its batch goes out."""
    node = ""
    try:
        async for events in batches:
            for event in events:
                if isinstance(event, Served):
                    node = event.node or ""  # a relay's answer always comes from a node
                elif isinstance(event, NodeStored) and keep is not None:
                    await keep(event.id, node)
            pieces = [event.data for event in events if isinstance(event, Raw)]
            if pieces:
                yield pieces
    finally:
        await aclose_quietly(batches)


def forwarded_headers(request: Request, names: tuple[str, ...]) -> dict[str, str]:
    """The client's headers among `names` that it sent, for the node."""
    return {name: value for name in names if (value := request.headers.get(name)) is not None}
