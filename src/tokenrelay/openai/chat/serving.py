"""What `/v1/chat/completions` parses, asks of a backend and renders (its route: `router.py`)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from tokenrelay.api.collect import Chunk, Collected
from tokenrelay.backends.base import Backend, Events, Ticket
from tokenrelay.openai.chat.render import ChatChunker, chat_response
from tokenrelay.openai.render import ResponseMeta
from tokenrelay.protocol.chat import ChatCompletionRequest


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

    def events(self, backend: Backend, body: ChatCompletionRequest, ticket: Ticket) -> AsyncIterator[Events]:
        return backend.chat(body, ticket)

    def chunks(
        self, body: ChatCompletionRequest, meta: ResponseMeta, events: AsyncIterator[Events]
    ) -> AsyncIterator[list[Chunk]]:
        chunker = ChatChunker(meta, want_logprobs=bool(body.logprobs), legacy_functions=_legacy(body))
        return chunker.chunks(events)

    def body(self, body: ChatCompletionRequest, meta: ResponseMeta, collected: Collected) -> dict[str, Any]:
        return chat_response(collected, meta, want_logprobs=bool(body.logprobs), legacy_functions=_legacy(body))
