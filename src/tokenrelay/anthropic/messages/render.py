"""Backend events → Messages API bodies: the whole `message`, or its stream's events.

Each stream event is a dict whose `type` is also its SSE `event:` name (see `sse.py`). The input token counts
are final only once the backend reports usage: `message_start` carries the prompt's count where it was made
beforehand (on the engine) and zeros otherwise ("usage so far"), and `message_delta` the final counts, which is how
Anthropic's own stream and SDK treat them (totals overwrite).
A node's reasoning (`reasoning_content`, or `reasoning` in newer vLLM) becomes a `thinking` block; its
`signature` is empty, since no one here signs thinking.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import aclosing
from dataclasses import dataclass
from typing import Any

from tokenrelay.api.collect import Chunk, Collected, chunk_batches, reasoning_text
from tokenrelay.backends.base import DeltaFields, Event, Events, Finish, TextDelta, TextRun, ToolCallDelta, Usage
from tokenrelay.errors import APIError

# Chat finish reasons → Anthropic stop reasons; "stop" depends on whether a stop sequence matched.
STOP_REASONS = {
    "length": "max_tokens",
    "tool_calls": "tool_use",
    "function_call": "tool_use",
    "content_filter": "refusal",
}


@dataclass(slots=True)
class MessageMeta:
    id: str
    model: str  # the model asked for, or the fallback that serves once one does
    input_tokens: int = 0  # the prompt's tokens when counted before the answer (`message_start`), else 0


def stop_reason(finish: str | None, stop_sequence: str | None, called: bool) -> str:
    """`called`: the answer holds tool calls, which is `tool_use` whatever the chat finish reason (a named
    tool choice ends with "stop") unless the calls were cut short."""
    if stop_sequence is not None:
        return "stop_sequence"
    if called and finish != "length":
        return "tool_use"
    return STOP_REASONS.get(finish or "stop", "end_turn")


def usage_body(usage: Usage) -> dict[str, int]:
    """Anthropic's meaning: `input_tokens` are the prompt tokens evaluated, not those read from the KV cache."""
    return {
        "input_tokens": usage.prompt_tokens - usage.cached_tokens,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": usage.cached_tokens,
        "output_tokens": usage.completion_tokens,
    }


def tool_use_id(call_id: str | None) -> str:
    """A chat call id as a `toolu_` id (ids are opaque: a client sends it back, and it is passed on as sent)."""
    return "toolu_" + (call_id or "").removeprefix("call_")


def tool_input(arguments: str) -> dict[str, Any]:
    try:
        value = json.loads(arguments or "{}")
    except ValueError:
        raise APIError("The model's tool call arguments are not valid JSON.") from None
    if not isinstance(value, dict):
        raise APIError("The model's tool call arguments are not a JSON object.")
    return value


def message_body(meta: MessageMeta, collected: Collected) -> dict[str, Any]:
    state = collected.choice(0)
    content: list[dict[str, Any]] = []
    if thinking := reasoning_text(state.extras):
        content.append({"type": "thinking", "thinking": thinking, "signature": ""})
    text = "".join(state.text)
    if text:
        content.append({"type": "text", "text": text})
    for index in sorted(state.tool_calls):
        call = state.tool_calls[index]
        content.append(
            {"type": "tool_use", "id": tool_use_id(call.id), "name": call.name, "input": tool_input(call.arguments)}
        )
    reason = stop_reason(state.finish_reason, state.stop_sequence, bool(state.tool_calls))
    return _message(meta, content, reason, state.stop_sequence) | {"usage": usage_body(collected.usage)}


def _message(meta: MessageMeta, content: list[dict[str, Any]], reason: str | None, stop: str | None) -> dict[str, Any]:
    return {
        "id": meta.id,
        "type": "message",
        "role": "assistant",
        "model": meta.model,
        "content": content,
        "stop_reason": reason,
        "stop_sequence": stop,
    }


class MessageStreamer:
    """Turns a backend's events into the Messages stream's events, block by block."""

    def __init__(self, meta: MessageMeta) -> None:
        self.meta = meta
        self.block: str | None = None  # the type of the open content block
        self.call: int | None = None  # the tool call whose block is open
        self.blocks = 0  # content blocks opened so far (the next block's index)
        self.finish: str | None = None
        self.stop_sequence: str | None = None
        self.usage = Usage()

    def opening(self) -> list[Chunk]:
        message = _message(self.meta, [], None, None) | {"usage": usage_body(Usage(self.meta.input_tokens))}
        return [{"type": "message_start", "message": message}, {"type": "ping"}]

    def event(self, event: Event) -> list[Chunk]:
        if isinstance(event, TextRun):
            return self._text(event.texts)
        if isinstance(event, TextDelta):
            return self._text([event.text]) if event.text else []
        if isinstance(event, ToolCallDelta):
            return self._tool(event)
        if isinstance(event, DeltaFields):
            thinking = reasoning_text(event.fields)
            return self._thinking(thinking) if thinking else []
        if isinstance(event, Finish):
            self.finish, self.stop_sequence = event.reason, event.stop_sequence
        elif isinstance(event, Usage):
            self.usage = event
        return []

    def closing(self) -> list[Chunk]:
        reason = stop_reason(self.finish, self.stop_sequence, self.call is not None)
        delta = {"stop_reason": reason, "stop_sequence": self.stop_sequence}
        return [
            *self._close(),
            {"type": "message_delta", "delta": delta, "usage": usage_body(self.usage)},
            {"type": "message_stop"},
        ]

    def _text(self, texts: list[str]) -> list[Chunk]:
        out = self._open("text", {"type": "text", "text": ""}) if self.block != "text" else []
        index = self.blocks - 1
        out += [
            {"type": "content_block_delta", "index": index, "delta": {"type": "text_delta", "text": t}} for t in texts
        ]
        return out

    def _thinking(self, text: str) -> list[Chunk]:
        block = {"type": "thinking", "thinking": "", "signature": ""}
        out = self._open("thinking", block) if self.block != "thinking" else []
        delta = {"type": "thinking_delta", "thinking": text}
        return [*out, {"type": "content_block_delta", "index": self.blocks - 1, "delta": delta}]

    def _tool(self, event: ToolCallDelta) -> list[Chunk]:
        out: list[Chunk] = []
        if self.block != "tool_use" or self.call != event.call_index:  # a call's first delta has its id and name
            block = {"type": "tool_use", "id": tool_use_id(event.id), "name": event.name or "", "input": {}}
            out = self._open("tool_use", block)
            self.call = event.call_index
        if event.arguments:
            delta = {"type": "input_json_delta", "partial_json": event.arguments}
            out.append({"type": "content_block_delta", "index": self.blocks - 1, "delta": delta})
        return out

    def _open(self, kind: str, block: dict[str, Any]) -> list[Chunk]:
        out = self._close()
        out.append({"type": "content_block_start", "index": self.blocks, "content_block": block})
        self.block = kind
        self.blocks += 1
        return out

    def _close(self) -> list[Chunk]:
        if self.block is None:
            return []
        index, signed = self.blocks - 1, self.block == "thinking"
        self.block = None
        # A thinking block ends with its signature, as Anthropic's do (empty: nothing here signs it).
        signature = {
            "type": "content_block_delta",
            "index": index,
            "delta": {"type": "signature_delta", "signature": ""},
        }
        return [*([signature] if signed else []), {"type": "content_block_stop", "index": index}]

    async def chunks(self, batches: AsyncIterator[Events]) -> AsyncIterator[list[Chunk]]:
        """The stream's events, per backend batch that shows; closing this closes `batches`.

        `message_start` goes out with the first content, so that a request the backend rejects before any
        (context too long, a full queue) still gets a plain HTTP error."""
        async with aclosing(chunk_batches(batches, self.event, self.opening)) as shown:
            async for chunks in shown:
                yield chunks
        yield self.closing()
