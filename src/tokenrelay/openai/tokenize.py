"""`POST /tokenize` and `POST /detokenize`: the model's own tokenizer, for building `logit_bias` maps and
token-id prompts (as llama.cpp's and vLLM's servers offer)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Request
from pydantic import Field
from starlette.responses import JSONResponse

from tokenrelay.apidoc.errors import error_responses
from tokenrelay.apidoc.operations import json_body
from tokenrelay.errors import InvalidRequest, ModelNotFound
from tokenrelay.openai.models import caller
from tokenrelay.openai.parsing import validate_json
from tokenrelay.protocol.common import WireModel

router = APIRouter()


class TokenizeRequest(WireModel):
    model: str
    prompt: str
    add_special: bool = False


class DetokenizeRequest(WireModel):
    model: str
    tokens: list[Annotated[int, Field(ge=0)]]


def _tokenizer(request: Request, model: str) -> Any:
    if not caller(request).may_use(model):
        raise ModelNotFound(model)
    backend = request.app.state.services.registry.get(model)
    if not hasattr(backend, "tokenize"):
        raise InvalidRequest(f"The model `{model}` is served by a backend without a local tokenizer.", param="model")
    return backend


@router.post("/tokenize", openapi_extra=json_body(TokenizeRequest), responses=error_responses(400, 404))
async def tokenize(request: Request) -> JSONResponse:
    body = validate_json(TokenizeRequest, await request.body())
    tokens = _tokenizer(request, body.model).tokenize(body.prompt, add_special=body.add_special)
    return JSONResponse({"tokens": tokens, "count": len(tokens)})


@router.post("/detokenize", openapi_extra=json_body(DetokenizeRequest), responses=error_responses(400, 404))
async def detokenize(request: Request) -> JSONResponse:
    body = validate_json(DetokenizeRequest, await request.body())
    return JSONResponse({"prompt": _tokenizer(request, body.model).detokenize(body.tokens)})
