"""The endpoint: validate, check the model's embedding settings, admit, embed, answer."""

from __future__ import annotations

import time

from starlette.requests import Request
from starlette.responses import Response

from tokenrelay.api.disconnect import cancel_on_disconnect
from tokenrelay.api.lifecycle import JSONBody
from tokenrelay.api.parsing import claims_noted, read_body, validate_json
from tokenrelay.api.server import Server
from tokenrelay.backends.base import Embeddings, Usage
from tokenrelay.calls.record import Call
from tokenrelay.config import ModelSettings
from tokenrelay.errors import UNSUPPORTED_PARAMETER, InvalidRequest
from tokenrelay.openai.embeddings import render
from tokenrelay.protocol.embeddings import EmbeddingRequest

ENDPOINT = "embeddings"  # the ledger's and the metrics' name for it


async def respond(request: Request, call: Call, services: Server) -> Response:
    """What `run_call` runs for `POST /v1/embeddings`."""
    raw = await read_body(request.receive)
    with claims_noted(call, raw):
        body = validate_json(EmbeddingRequest, raw)
    call.model, call.user = body.model, body.user
    backend = await services.admit(call, body)  # after it, the caller may know the model exists
    call.backend = backend.kind
    check_settings(body, services.model_settings(body.model))
    with cancel_on_disconnect(request.receive):
        result = await backend.embed(body, call.ticket)
    record(call, result)
    vectors = result.vectors
    if body.dimensions is not None:
        vectors = [render.truncated(vector, body.dimensions) for vector in vectors]
    answer = render.body(call.served_model or body.model, vectors, result.prompt_tokens, body.base64)
    return JSONBody(answer)


def check_settings(body: EmbeddingRequest, settings: ModelSettings | None) -> None:
    """The model's settings allow what the request asks (a model that nodes brought has the defaults)."""
    if settings is not None and not settings.embeddings:
        raise InvalidRequest(f"The model `{body.model}` serves no embeddings.", param="model")
    if body.dimensions is not None and (settings is None or not settings.embeddings_truncatable):
        raise InvalidRequest(
            f"The model `{body.model}` cannot shorten its embeddings: `dimensions` needs a model whose "
            "settings mark its embeddings truncatable (embeddings_truncatable).",
            param="dimensions",
            code=UNSUPPORTED_PARAMETER,
        )


def record(call: Call, result: Embeddings) -> None:
    call.report_usage(Usage(prompt_tokens=result.prompt_tokens, estimated=result.estimated))
    if result.served_by is not None:
        call.saw(result.served_by)
    call.ended = time.monotonic()
