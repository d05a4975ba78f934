"""What `/v1/messages` and `/v1/messages/count_tokens` do: a Messages request is translated into a chat
request and served by the backend's `chat`, through the same call record, admission and report as chat
completions (ledger rows carry the endpoint `messages`); the backend's events are rendered back.

A model whose members are all nodes that declare `native_apis: [messages]` gets the body as sent instead (only
`model` rewritten, the client's `anthropic-version`/`anthropic-beta` passed on) and answers with the node's own
message (`api/relayed.py`), after the same validation and admission.
"""

from __future__ import annotations

import functools
from typing import Any, TypeVar

from pydantic import BaseModel
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from tokenrelay.anthropic.messages.errors import error_body, invalid_body
from tokenrelay.anthropic.messages.protocol import CountTokensRequest, MessagesRequest
from tokenrelay.anthropic.messages.render import MessageMeta, MessageStreamer, message_body
from tokenrelay.anthropic.messages.translate import to_chat
from tokenrelay.api.collect import collect
from tokenrelay.api.ignored import ignored_header
from tokenrelay.api.lifecycle import run_call, stream_or_collect
from tokenrelay.api.parsing import claims_noted, read_body, validate_json
from tokenrelay.api.relayed import forwarded_headers, relayed_response, relays
from tokenrelay.api.server import Server, caller_of, services_of
from tokenrelay.api.sse import NamedFraming
from tokenrelay.backends.base import NativeApi, NativeRequest, NodeBacked, OnDemand, Served, Tokenizer
from tokenrelay.calls.record import Call, observed
from tokenrelay.calls.request_ids import request_id_of
from tokenrelay.errors import ModelNotFound
from tokenrelay.jsonbytes import loads

ENDPOINT: NativeApi = "messages"  # the ledger's, the metrics' and the request log's name for these calls
# The client's headers a Messages node gets: which API version and betas the client's body is written for.
ANTHROPIC_HEADERS = ("anthropic-version", "anthropic-beta")

Body = TypeVar("Body", bound=BaseModel)


async def create_message(request: Request) -> Response:
    return await run_call(request, ENDPOINT, _create)


async def _create(request: Request, call: Call, services: Server) -> Response:
    raw = await read_body(request.receive)
    with claims_noted(call, raw):
        body = validated(raw, MessagesRequest)
    chat = to_chat(body, stream=bool(body.stream))
    call.model, call.streamed, call.user = body.model, bool(body.stream), chat.user
    backend = await services.admit(call, chat)
    if relays(backend, ENDPOINT):
        headers = forwarded_headers(request, ANTHROPIC_HEADERS)
        native = NativeRequest(ENDPOINT, loads(raw), chat, headers)
        return await relayed_response(request, call, backend, native, error_body)
    call.backend, call.ignored = backend.kind, body.ignored()
    meta = MessageMeta(id=f"msg_{call.request_id}", model=body.model)
    if body.stream and isinstance(backend, Tokenizer | OnDemand):
        # The engine counts the prompt exactly in milliseconds, so `message_start` tells the client its size at
        # once (an agent shows its context use from it); a node's count comes only with its answer.
        meta.input_tokens = (await backend.count_chat_prompt(chat)).tokens
    call.on_served = functools.partial(_served_by, meta)
    events = observed(backend.chat(chat, call.ticket), call)

    async def whole() -> dict[str, Any]:
        return message_body(meta, await collect(events))

    chunks = functools.partial(MessageStreamer(meta).chunks, events)
    return await stream_or_collect(request, bool(body.stream), chunks, whole, NamedFraming(error_body))


def _served_by(meta: MessageMeta, served: Served) -> None:
    meta.model = served.model or meta.model


async def count_tokens(request: Request) -> Response:
    """The prompt the same `messages` would evaluate: exact on the embedded engine; for nodes, the count of a node
    that serves Messages itself, or of a node's tokenizer endpoint, or else an estimate. Nothing is generated,
    so nothing is admitted against limits or recorded."""
    principal = caller_of(request)
    raw = await read_body(request.receive)
    body = validated(raw, CountTokensRequest)
    chat = to_chat(body)
    if not principal.may_use(body.model):
        raise ModelNotFound(body.model)
    backend = await services_of(request).backend(body.model)
    if isinstance(backend, NodeBacked) and backend.relays(ENDPOINT):
        native = NativeRequest(ENDPOINT, loads(raw), chat, forwarded_headers(request, ANTHROPIC_HEADERS))
        return JSONResponse({"input_tokens": await backend.count_natively(native, request_id_of(request.scope))})
    count = await backend.count_chat_prompt(chat)
    response = JSONResponse({"input_tokens": count.tokens})
    if ignored := body.ignored():
        response.raw_headers.append(ignored_header(ignored))
    return response


def validated(raw: bytes, model: type[Body]) -> Body:
    return validate_json(model, raw, complaint=invalid_body)
