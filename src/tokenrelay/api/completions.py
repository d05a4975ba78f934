"""`POST /v1/completions`."""

from __future__ import annotations

from fastapi import APIRouter, Request
from starlette.responses import Response

from tokenrelay.api.generation import collected, json_response, response_meta, streamed
from tokenrelay.api.parsing import parse_body
from tokenrelay.protocol.completions import CompletionRequest
from tokenrelay.render.completions import CompletionChunker, completion_response

router = APIRouter()


@router.post("/v1/completions")
async def completions(request: Request) -> Response:
    services = request.app.state.services
    body = await parse_body(request, CompletionRequest, services.settings.max_n)
    backend = services.registry.get(body.model)
    choices = body.choices * len(body.prompts)
    meta = response_meta(request, "cmpl", body.model, backend.fingerprint(), choices, include_usage=body.include_usage)
    events = backend.complete(body, request.state.request_id)
    want_logprobs = body.logprobs is not None
    if body.stream:
        return await streamed(request, CompletionChunker(meta, want_logprobs=want_logprobs).chunks(events))
    result = await collected(request, events)
    return json_response(completion_response(result, meta, want_logprobs=want_logprobs))
