"""`POST /v1/chat/completions`."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, Request
from starlette.responses import Response

from tokenrelay.api.generation import handle
from tokenrelay.backends.base import Backend, Event
from tokenrelay.protocol.chat import ChatCompletionRequest
from tokenrelay.render.chat import ChatChunker, chat_response
from tokenrelay.render.common import Chunk, Collected, ResponseMeta

router = APIRouter()


def _legacy(body: ChatCompletionRequest) -> bool:
    return bool(body.functions) and not body.tools


class ChatEndpoint:
    name = "chat.completions"
    id_prefix = "chatcmpl"
    request_model = ChatCompletionRequest

    def choices(self, body: ChatCompletionRequest) -> int:
        return body.choices

    def meta_extra(self, body: ChatCompletionRequest) -> dict[str, Any]:
        return {"service_tier": body.service_tier}

    def events(self, backend: Backend, body: ChatCompletionRequest, request_id: str) -> AsyncIterator[Event]:
        return backend.chat(body, request_id)

    def chunks(
        self, body: ChatCompletionRequest, meta: ResponseMeta, events: AsyncIterator[Event]
    ) -> AsyncIterator[Chunk]:
        chunker = ChatChunker(meta, want_logprobs=bool(body.logprobs), legacy_functions=_legacy(body))
        return chunker.chunks(events)

    def body(self, body: ChatCompletionRequest, meta: ResponseMeta, collected: Collected) -> dict[str, Any]:
        return chat_response(collected, meta, want_logprobs=bool(body.logprobs), legacy_functions=_legacy(body))


@router.post("/v1/chat/completions")
async def chat_completions(request: Request) -> Response:
    return await handle(request, ChatEndpoint())
