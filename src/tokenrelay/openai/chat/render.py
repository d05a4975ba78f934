"""Chat completion bodies (`chat.completion`) and chunks (`chat.completion.chunk`)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from tokenrelay.api.collect import ChoiceState, Chunk, Collected, chunk_batches
from tokenrelay.backends.base import (
    DeltaFields,
    Event,
    Events,
    Finish,
    TextDelta,
    TextRun,
    TokenLogprob,
    ToolCallDelta,
    Usage,
)
from tokenrelay.openai.render import ResponseMeta, chunk_body, usage_body


def logprob_content(items: list[TokenLogprob]) -> list[dict[str, Any]]:
    return [
        {
            "token": item.token,
            "logprob": item.logprob,
            "bytes": item.bytes,
            "top_logprobs": [{"token": t.token, "logprob": t.logprob, "bytes": t.bytes} for t in item.top],
        }
        for item in items
    ]


def _tool_call_body(call: ToolCallDelta) -> dict[str, Any]:
    return {"id": call.id, "type": "function", "function": {"name": call.name, "arguments": call.arguments}}


def _message(state: ChoiceState, legacy_functions: bool) -> dict[str, Any]:
    text = "".join(state.text)
    message: dict[str, Any] = {"role": "assistant", "content": text, "refusal": None}
    calls = [state.tool_calls[i] for i in sorted(state.tool_calls)]
    if calls and legacy_functions:
        message["content"] = text or None
        message["function_call"] = _tool_call_body(calls[0])["function"]
    elif calls:
        message["content"] = text or None
        message["tool_calls"] = [_tool_call_body(call) for call in calls]
    return message | state.extras


def _stop_reason(stop: str | None) -> dict[str, Any]:
    """vLLM's `stop_reason` (not in the OpenAI API): which stop sequence ended a choice, sent only when one did.
    A gateway in front of this server reads it to say exactly which one matched (Anthropic's `stop_sequence`)."""
    return {} if stop is None else {"stop_reason": stop}


def chat_response(
    collected: Collected, meta: ResponseMeta, *, want_logprobs: bool, legacy_functions: bool = False
) -> dict[str, Any]:
    choices = []
    for index in range(meta.choices):
        state = collected.choice(index)
        choice = {
            "index": index,
            "message": _message(state, legacy_functions),
            "logprobs": {"content": logprob_content(state.logprobs), "refusal": None} if want_logprobs else None,
            "finish_reason": state.finish_reason,
        }
        choices.append(choice | _stop_reason(state.stop_sequence))
    return {
        "id": meta.id,
        "object": "chat.completion",
        "created": meta.created,
        "model": meta.model,
        "choices": choices,
        "usage": usage_body(collected.usage),
        "system_fingerprint": meta.system_fingerprint,
        "service_tier": meta.service_tier,
    }


class ChatChunker:
    """Turns a backend's events into `chat.completion.chunk` dicts in the OpenAI order."""

    def __init__(self, meta: ResponseMeta, *, want_logprobs: bool, legacy_functions: bool = False) -> None:
        self.meta = meta
        self.want_logprobs = want_logprobs
        self.legacy_functions = legacy_functions

    def chunk(self, choices: list[dict[str, Any]], usage: dict[str, Any] | None = None) -> Chunk:
        return chunk_body(self.meta, "chat.completion.chunk", choices, usage, service_tier=self.meta.service_tier)

    def _choice(self, index: int, delta: dict[str, Any], **extra: Any) -> dict[str, Any]:
        return {"index": index, "delta": delta, "logprobs": None, "finish_reason": None} | extra

    def opening(self) -> list[Chunk]:
        return [self.chunk([self._choice(i, {"role": "assistant", "content": ""})]) for i in range(self.meta.choices)]

    def event(self, event: Event) -> list[Chunk]:
        """The chunks one event becomes: one per text of a run, none for an event the stream does not show."""
        if isinstance(event, TextRun):
            return [self._text(event.index, text, []) for text in event.texts]
        if isinstance(event, TextDelta):
            return [self._text(event.index, event.text, event.logprobs)]
        if isinstance(event, ToolCallDelta):
            return [self.chunk([self._choice(event.index, self._tool_delta(event))])]
        if isinstance(event, Finish):
            extra = _stop_reason(event.stop_sequence)
            return [self.chunk([self._choice(event.index, {}, finish_reason=event.reason, **extra)])]
        if isinstance(event, Usage) and self.meta.include_usage:
            return [self.chunk([], usage_body(event))]
        if isinstance(event, DeltaFields):
            return [self.chunk([self._choice(event.index, dict(event.fields))])]
        return []

    def _text(self, index: int, text: str, logprobs: list[TokenLogprob]) -> Chunk:
        content = {"content": logprob_content(logprobs), "refusal": None} if self.want_logprobs else None
        # Most chunks are this one: its choice is written out whole rather than merged in `_choice`.
        return self.chunk([{"index": index, "delta": {"content": text}, "logprobs": content, "finish_reason": None}])

    def _tool_delta(self, event: ToolCallDelta) -> dict[str, Any]:
        function: dict[str, Any] = {"arguments": event.arguments}
        if event.name is not None:
            function["name"] = event.name
        if self.legacy_functions:
            return {"function_call": function}
        call: dict[str, Any] = {"index": event.call_index, "function": function}
        if event.id is not None:
            call |= {"id": event.id, "type": "function"}
        return {"tool_calls": [call]}

    def chunks(self, batches: AsyncIterator[Events]) -> AsyncIterator[list[Chunk]]:
        return chunk_batches(batches, self.event, self.opening)
