"""`POST /v1/chat/completions`."""

from __future__ import annotations

from fastapi import APIRouter, Request
from starlette.responses import Response

from tokenrelay.api.generation import collected, json_response, response_meta, streamed
from tokenrelay.api.parsing import parse_body
from tokenrelay.protocol.chat import ChatCompletionRequest
from tokenrelay.render.chat import ChatChunker, chat_response

router = APIRouter()


@router.post("/v1/chat/completions")
async def chat_completions(request: Request) -> Response:
    services = request.app.state.services
    body = await parse_body(request, ChatCompletionRequest, services.settings.max_n)
    backend = services.registry.get(body.model)
    meta = response_meta(
        request,
        "chatcmpl",
        body.model,
        backend.fingerprint(),
        body.choices,
        include_usage=body.include_usage,
        service_tier=body.service_tier,
    )
    events = backend.chat(body, request.state.request_id)
    legacy = bool(body.functions) and not body.tools
    want_logprobs = bool(body.logprobs)
    if body.stream:
        chunker = ChatChunker(meta, want_logprobs=want_logprobs, legacy_functions=legacy)
        return await streamed(request, chunker.chunks(events))
    result = await collected(request, events)
    return json_response(chat_response(result, meta, want_logprobs=want_logprobs, legacy_functions=legacy))
