"""Text completion bodies and chunks (`text_completion`)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from tokenrelay.backends.base import Event, Finish, TextDelta, TokenLogprob, Usage
from tokenrelay.render.common import Chunk, Collected, ResponseMeta, chunk_body, usage_body
from tokenrelay.render.runs import RunFrames


def completion_logprobs(items: list[TokenLogprob]) -> dict[str, Any]:
    return {
        "tokens": [item.token for item in items],
        "token_logprobs": [item.logprob for item in items],
        "top_logprobs": [
            {t.token: t.logprob for t in item.top} if item.logprob is not None else None for item in items
        ],
        "text_offset": [item.text_offset for item in items],
    }


def completion_response(collected: Collected, meta: ResponseMeta, *, want_logprobs: bool) -> dict[str, Any]:
    choices = []
    for index in range(meta.choices):
        state = collected.choice(index)
        choices.append(
            {
                "index": index,
                "text": "".join(state.text),
                "logprobs": completion_logprobs(state.logprobs) if want_logprobs else None,
                "finish_reason": state.finish_reason,
            }
        )
    return {
        "id": meta.id,
        "object": "text_completion",
        "created": meta.created,
        "model": meta.model,
        "choices": choices,
        "usage": usage_body(collected.usage),
        "system_fingerprint": meta.system_fingerprint,
    }


class CompletionChunker:
    def __init__(self, meta: ResponseMeta, *, want_logprobs: bool) -> None:
        self.meta = meta
        self.want_logprobs = want_logprobs
        self.runs = RunFrames(self.event)

    def chunk(self, choices: list[dict[str, Any]], usage: dict[str, Any] | None = None) -> dict[str, Any]:
        return chunk_body(self.meta, "text_completion", choices, usage)

    def event(self, event: Event) -> dict[str, Any] | None:
        if isinstance(event, TextDelta):
            logprobs = completion_logprobs(event.logprobs) if self.want_logprobs else None
            return self.chunk([{"index": event.index, "text": event.text, "logprobs": logprobs, "finish_reason": None}])
        if isinstance(event, Finish):
            return self.chunk([{"index": event.index, "text": "", "logprobs": None, "finish_reason": event.reason}])
        if isinstance(event, Usage) and self.meta.include_usage:
            return self.chunk([], usage_body(event))
        return None

    async def chunks(self, events: AsyncIterator[Event]) -> AsyncIterator[Chunk]:
        async for event in events:
            body = self.runs.piece(event)
            if body is not None:
                yield body
