"""`POST /tokenize` and `POST /detokenize`: the model's own tokenizer, for building `logit_bias` maps and
token-id prompts (as llama.cpp's and vLLM's servers offer).

`/tokenize` takes a `prompt` (text as it is) or, in vLLM's shape, chat `messages` (with `tools`,
`add_generation_prompt` and `continue_final_message`): their tokens are exactly the prompt the chat endpoint would
evaluate for them, so a gateway in front of this server can count a chat request's prompt before sending it.
"""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import APIRouter, Request
from pydantic import ConfigDict, Field, RootModel
from starlette.responses import JSONResponse

from tokenrelay.api.parsing import validate_json
from tokenrelay.api.server import caller_of, services_of
from tokenrelay.apidoc.errors import error_responses
from tokenrelay.apidoc.operations import json_body
from tokenrelay.backends.base import OnDemand, Tokenizer
from tokenrelay.errors import InvalidRequest, ModelNotFound
from tokenrelay.jsonbytes import dumps
from tokenrelay.protocol.chat import ChatCompletionRequest, Message, NamedToolChoice, Tool, needs_list
from tokenrelay.protocol.common import WireModel

router = APIRouter()


class TokenizeRequest(WireModel):
    """Text to tokenize as it is."""

    model_config = ConfigDict(extra="forbid")
    model: str
    prompt: str
    add_special: bool = False


class ChatTokenizeRequest(WireModel):
    """Chat messages to tokenize as the chat endpoint renders them (vLLM's shape, and chat's `tool_choice`)."""

    model_config = ConfigDict(extra="forbid", json_schema_extra={"allOf": [needs_list("tool_choice", "tools")]})
    model: str
    messages: Annotated[list[Message], Field(min_length=1)]
    tools: Annotated[list[Tool], Field(min_length=1)] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    add_generation_prompt: bool = Field(default=True, description="open the assistant's turn, as chat does")
    continue_final_message: bool = False

    def as_chat(self) -> ChatCompletionRequest:
        """The chat request these fields describe, validated as the chat endpoint validates it."""
        fields = self.model_dump(mode="json", exclude_unset=True, exclude={"add_generation_prompt"})
        return validate_json(ChatCompletionRequest, dumps(fields))


class TokenizeBody(RootModel[TokenizeRequest | ChatTokenizeRequest]):
    """Either shape of a `/tokenize` body."""


class DetokenizeRequest(WireModel):
    model: str
    tokens: list[Annotated[int, Field(ge=0)]]


async def _tokenizer(request: Request, model: str) -> Tokenizer:
    if not caller_of(request).may_use(model):
        raise ModelNotFound(model)
    backend = services_of(request).registry.get(model)
    if isinstance(backend, OnDemand):
        backend = await backend.loaded()
    if not isinstance(backend, Tokenizer):
        raise InvalidRequest(f"The model `{model}` is served by a backend without a local tokenizer.", param="model")
    return backend


@router.post("/tokenize", openapi_extra=json_body(TokenizeBody), responses=error_responses(400, 404))
async def tokenize(request: Request) -> JSONResponse:
    body = validate_json(TokenizeBody, await request.body()).root
    backend = await _tokenizer(request, body.model)
    if isinstance(body, TokenizeRequest):
        tokens = backend.tokenize(body.prompt, add_special=body.add_special)
    else:
        # A continued message is left open whatever `add_generation_prompt` says (an empty one opens a new turn,
        # as chat does).
        opened = body.add_generation_prompt or body.continue_final_message
        tokens = await backend.chat_tokens(body.as_chat(), opened=opened)
    return JSONResponse({"tokens": tokens, "count": len(tokens), "max_model_len": backend.n_ctx})


@router.post("/detokenize", openapi_extra=json_body(DetokenizeRequest), responses=error_responses(400, 404))
async def detokenize(request: Request) -> JSONResponse:
    body = validate_json(DetokenizeRequest, await request.body())
    backend = await _tokenizer(request, body.model)
    return JSONResponse({"prompt": backend.detokenize(body.tokens)})
