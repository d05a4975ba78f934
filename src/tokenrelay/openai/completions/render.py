"""Text completion bodies and chunks (`text_completion`)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from tokenrelay.api.collect import Chunk, Collected, chunk_batches
from tokenrelay.backends.base import Event, Events, Finish, TextDelta, TextRun, TokenLogprob, Usage
from tokenrelay.openai.render import ResponseMeta, chunk_body, usage_body


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
    """Turns a backend's events into `text_completion` chunk dicts."""

    def __init__(self, meta: ResponseMeta, *, want_logprobs: bool) -> None:
        self.meta = meta
        self.want_logprobs = want_logprobs

    def chunk(self, choices: list[dict[str, Any]], usage: dict[str, Any] | None = None) -> Chunk:
        return chunk_body(self.meta, "text_completion", choices, usage)

    def event(self, event: Event) -> list[Chunk]:
        """The chunks one event becomes: one per text of a run, none for an event the stream does not show."""
        if isinstance(event, TextRun):
            return [self._text(event.index, text, []) for text in event.texts]
        if isinstance(event, TextDelta):
            return [self._text(event.index, event.text, event.logprobs)]
        if isinstance(event, Finish):
            return [self.chunk([{"index": event.index, "text": "", "logprobs": None, "finish_reason": event.reason}])]
        if isinstance(event, Usage) and self.meta.include_usage:
            return [self.chunk([], usage_body(event))]
        return []

    def _text(self, index: int, text: str, logprobs: list[TokenLogprob]) -> Chunk:
        content = completion_logprobs(logprobs) if self.want_logprobs else None
        return self.chunk([{"index": index, "text": text, "logprobs": content, "finish_reason": None}])

    def chunks(self, batches: AsyncIterator[Events]) -> AsyncIterator[list[Chunk]]:
        return chunk_batches(batches, self.event, list)  # no opening chunks
