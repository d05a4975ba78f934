"""`POST /v1/responses`: the request translated to chat, run through the same call flow, answered as a response.

The call is the chat endpoints' (`api.lifecycle.run_call`): the same key checks, limits, budget, ledger row
(endpoint `responses`), metrics and request log, and the same backend `chat(...)`, so upstream nodes that speak
chat serve Responses clients too.

A model whose members are all nodes that declare `native_apis: [responses]` gets the body as sent instead
(only `model` rewritten) and answers with the node's own response (`api/relayed.py`); it is still validated
and translated here, for the same 400s and for admission. Such responses are the node's: stored there, not
here, and a `previous_response_id` is passed on for the node to resolve.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from pydantic import ValidationError
from sqlalchemy.exc import SQLAlchemyError
from starlette.requests import Request
from starlette.responses import Response

from tokenrelay.api.collect import collect
from tokenrelay.api.disconnect import cancel_on_disconnect
from tokenrelay.api.lifecycle import JSONBody, run_call, streamed
from tokenrelay.api.parsing import claims_noted, read_body, validate_json
from tokenrelay.api.relayed import relayed_response, relays
from tokenrelay.api.server import Server
from tokenrelay.api.sse import NamedFraming
from tokenrelay.backends.base import (
    ENGINE_KIND,
    Backend,
    Events,
    NativeApi,
    NativeRequest,
    Served,
    Ticket,
    aclose_quietly,
)
from tokenrelay.backends.fallback import started
from tokenrelay.calls.record import Call, observed
from tokenrelay.errors import CONTEXT_LENGTH_EXCEEDED as CONTEXT_FULL
from tokenrelay.errors import INVALID_VALUE, APIError, InvalidRequest, NotFound, field_path, from_validation_error
from tokenrelay.jsonbytes import loads
from tokenrelay.openai.responses import translate
from tokenrelay.openai.responses.ids import new_id
from tokenrelay.openai.responses.protocol import ResponsesRequest
from tokenrelay.openai.responses.render import ResponseHead, collected_response
from tokenrelay.openai.responses.stream import Payload, ResponseStream
from tokenrelay.protocol.chat import ChatCompletionRequest
from tokenrelay.store.responses import ResponseStore

log = logging.getLogger(__name__)

ENDPOINT: NativeApi = "responses"
Save = Callable[[dict[str, Any]], Awaitable[None]]


async def create_response(request: Request) -> Response:
    return await run_call(request, ENDPOINT, _respond)


async def _respond(request: Request, call: Call, services: Server) -> Response:
    raw = await read_body(request.receive)
    with claims_noted(call, raw):
        body = parse(raw)
    call.model, call.streamed, call.user = body.model, bool(body.stream), body.user
    if relays(await services.backend(body.model), ENDPOINT):
        return await _relay(request, call, services, body, raw)
    store: ResponseStore = services.responses
    context = await _context(store, body, call.key_id)
    items = translate.input_items(body)
    conversation = translate.Conversation(context, items)
    chat = translate.chat_request(body, conversation)
    backend = await services.admit(call, chat)
    call.backend, call.ignored = backend.kind, body.ignored(follows_lark=backend.kind == ENGINE_KIND)
    head = ResponseHead(new_id("resp"), int(time.time()), body)
    call.on_served = functools.partial(_served_by, head)
    save = functools.partial(_save, store, body, call.key_id, items, context)
    events = observed(fitted(backend, body, conversation, chat, call.ticket), call)
    if body.stream:
        payloads = stream_payloads(ResponseStream(head), events, save)
        return await streamed(payloads, NamedFraming(error_event), request.receive)
    # Not `stream_or_collect`: the save is outside the disconnect guard, so an answer that was made is stored.
    with cancel_on_disconnect(request.receive):
        response = collected_response(head, await collect(events))
    await save(response)
    return JSONBody(response)


async def _relay(request: Request, call: Call, services: Server, body: ResponsesRequest, raw: bytes) -> Response:
    """The body as sent to a node that serves Responses itself. The node keeps its responses; the gateway
    keeps whose each is and which node holds it, so that reads of it (`router.py`) and a `previous_response_id`
    reach that node, for the key that made it only (the node sees the gateway's key alone)."""
    store: ResponseStore = services.responses
    node = await _holder(store, body, call.key_id)
    chat = translate.chat_request(body, translate.Conversation([], translate.input_items(body)))
    backend = await services.admit(call, chat)
    native = NativeRequest(ENDPOINT, loads(raw), chat, node=node)
    keep = functools.partial(_keep, store, call)
    return await relayed_response(request, call, backend, native, error_event, keep)


async def _holder(store: ResponseStore, body: ResponsesRequest, key_id: str | None) -> str | None:
    """The node that keeps the response a relayed request continues (None without one); a 404 when this key
    made no such response through a node."""
    if body.previous_response_id is None:
        return None
    previous = await store.get(body.previous_response_id, key_id)
    if previous is None or previous.node is None:
        raise NotFound(f"No response with id '{body.previous_response_id}' was found.", param="previous_response_id")
    return previous.node


async def _keep(store: ResponseStore, call: Call, response_id: str, node: str) -> None:
    # Under the model whose node keeps it (a fallback's, when one served), where later reads of it are sent.
    try:
        await store.put_relayed(response_id, call.key_id, call.served_model or call.model, node)
    except SQLAlchemyError:  # the answer still goes out; only later reads of it through the gateway fail
        log.exception("could not remember the node's stored response %s", response_id)


async def _context(store: ResponseStore, body: ResponsesRequest, key_id: str | None) -> list[dict[str, Any]]:
    """The conversation `previous_response_id` continues (empty without one); a 404 when this key has no
    such response (never made, made by another key, deleted or expired)."""
    if body.previous_response_id is None:
        return []
    previous = await store.get(body.previous_response_id, key_id)
    if previous is None or previous.node is not None:  # a node's response: its conversation is not here
        raise NotFound(f"No response with id '{body.previous_response_id}' was found.", param="previous_response_id")
    return previous.conversation


def parse(raw: bytes) -> ResponsesRequest:
    """The body, strictly validated; a complaint becomes one 400 whose `param` is the field's path."""
    return validate_json(ResponsesRequest, raw, complaint=_invalid)


def _invalid(exc: ValidationError, body: Any) -> InvalidRequest:
    """The deepest complaint (where `input` is neither a string nor a valid list, the list's item is the news),
    an unknown field first among equals."""
    errors = exc.errors(include_url=False)
    if errors[0].get("type") == "json_invalid":
        return from_validation_error(exc)
    deepest = max(errors, key=lambda error: (len(error.get("loc", ())), error.get("type") == "extra_forbidden"))
    param = ".".join(str(part) for part in field_path(deepest.get("loc", ()), body)) or None
    where = f" at `{param}`" if param else ""
    message = deepest.get("msg", "invalid value")
    if deepest.get("type") == "extra_forbidden":
        message = "this field is not part of the item"
    return InvalidRequest(f"Invalid value{where}: {message}", param=param, code=INVALID_VALUE)


async def _save(
    store: ResponseStore,
    body: ResponsesRequest,
    key_id: str | None,
    items: list[dict[str, Any]],
    context: list[dict[str, Any]],
    response: dict[str, Any],
) -> None:
    if body.store is not False:
        await store.put(response, key_id, items, context)


async def fitted(
    backend: Backend,
    body: ResponsesRequest,
    conversation: translate.Conversation,
    chat: ChatCompletionRequest,
    ticket: Ticket,
) -> AsyncIterator[Events]:
    """The backend's batches of events for the conversation. With `truncation: auto`, a conversation the model's context
    cannot hold loses its oldest items until it fits (the instructions stay); otherwise the error is a 400
    naming the input item it came from."""
    while True:
        try:
            events, first = await started(functools.partial(backend.chat, chat, ticket))
            break
        except APIError as exc:
            if exc.code != CONTEXT_FULL or body.truncation != "auto" or not conversation.drop_oldest():
                raise translate.relocated(exc, conversation) from None
            log.debug("truncation auto: left out the oldest %d item(s)", conversation.dropped)
            chat = translate.chat_request(body, conversation)
    try:
        if first is not None:
            yield first
        async for batch in events:
            yield batch
    finally:
        await aclose_quietly(events)


async def stream_payloads(
    stream: ResponseStream, batches: AsyncIterator[Events], save: Save
) -> AsyncIterator[list[Payload]]:
    """The stream's payloads batch by batch. Failures before anything went out are raised (a plain HTTP error);
    after that, an `error` event and `response.failed` end the stream."""
    try:
        async for events in batches:
            payloads = [payload for event in events for payload in stream.event(event)]
            if payloads:
                yield payloads
        response, closing = stream.final()
    except APIError as exc:
        if not stream.started:
            raise
        response, closing = stream.failed(exc)
    except Exception:
        if not stream.started:
            raise
        log.exception("a responses stream failed after the first byte")
        response, closing = stream.failed(APIError("The server failed while streaming the response."))
    finally:
        await aclose_quietly(batches)
    await save(response)  # before the last event, so a client that reads it can retrieve the response at once
    yield closing


def _served_by(head: ResponseHead, served: Served) -> None:
    head.served_model = served.model


def error_event(exc: APIError) -> Payload:
    """The framing's error payload. `stream_payloads` turns failures after the first byte into numbered
    `error` and `response.failed` events itself, so this is written only if that ever fails."""
    return {"type": "error", "code": exc.code or exc.type, "message": exc.message, "param": exc.param}
