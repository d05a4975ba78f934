"""What `/v1/completions` parses, asks of a backend and renders (its route: `router.py`)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from tokenrelay.api.collect import Chunk, Collected
from tokenrelay.backends.base import Backend, Events, Ticket
from tokenrelay.openai.completions.render import CompletionChunker, completion_response
from tokenrelay.openai.render import ResponseMeta
from tokenrelay.protocol.completions import CompletionRequest


class CompletionsEndpoint:
    name = "completions"
    id_prefix = "cmpl"
    request_model = CompletionRequest

    def choices(self, body: CompletionRequest) -> int:
        return body.choices * len(body.prompts)

    def meta_extra(self, body: CompletionRequest) -> dict[str, Any]:
        return {}

    def events(self, backend: Backend, body: CompletionRequest, ticket: Ticket) -> AsyncIterator[Events]:
        return backend.complete(body, ticket)

    def chunks(
        self, body: CompletionRequest, meta: ResponseMeta, events: AsyncIterator[Events]
    ) -> AsyncIterator[list[Chunk]]:
        return CompletionChunker(meta, want_logprobs=body.logprobs is not None).chunks(events)

    def body(self, body: CompletionRequest, meta: ResponseMeta, collected: Collected) -> dict[str, Any]:
        return completion_response(collected, meta, want_logprobs=body.logprobs is not None)
