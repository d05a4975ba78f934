"""A node's OpenAI JSON (stream chunks or whole bodies) → backend events.

The same functions read a chunk's `delta` and a whole body's `message`: both carry the same fields, a
chunk carrying a piece of them. Anything a node sends that the event model lacks (e.g. `reasoning_content`)
is kept as `DeltaFields` so the client still sees it.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, TypeGuard

from tokenrelay.backends.base import (
    DeltaFields,
    Event,
    Finish,
    TextDelta,
    TextRun,
    TokenLogprob,
    ToolCallDelta,
    TopLogprob,
    Usage,
)

# Message fields the events model themselves; `role` is implied by the endpoint.
_MODELLED = frozenset({"role", "content", "tool_calls", "function_call"})


def chat_events(body: dict[str, Any], key: str) -> list[Event]:
    """Events of a chat chunk (`key="delta"`) or a chat body (`key="message"`), usage excluded."""
    events: list[Event] = []
    choices = body.get("choices")
    for choice in choices if isinstance(choices, list) else ():
        if not isinstance(choice, dict):
            continue
        index = _int(choice.get("index"))
        message = choice.get(key) or {}
        raw_logprobs = choice.get("logprobs")  # null in most chunks
        logprobs = chat_logprobs(raw_logprobs) if raw_logprobs else []
        content = message.get("content")
        if content or logprobs:
            events.append(TextDelta(index, content if isinstance(content, str) else "", logprobs))
        # Most chunks carry `content` alone (and `role` first): the checks below are skipped for them.
        if "tool_calls" in message or "function_call" in message:
            events.extend(_tool_calls(index, message))
        if not _MODELLED.issuperset(message):
            extras = {k: v for k, v in message.items() if k not in _MODELLED and v is not None}
            if extras:
                events.append(DeltaFields(index, extras))
        if choice.get("finish_reason"):
            events.append(Finish(index, str(choice["finish_reason"]), _stop_sequence(choice)))
    return events


def _stop_sequence(choice: dict[str, Any]) -> str | None:
    # vLLM's `stop_reason` (tokenrelay sends it too): the stop string that matched; a token id or null otherwise.
    stop = choice.get("stop_reason")
    return stop if isinstance(stop, str) else None


def completion_events(body: dict[str, Any]) -> list[Event]:
    """Events of a text completion chunk or body, usage excluded."""
    events: list[Event] = []
    for choice in _choices(body):
        index = _int(choice.get("index"))
        text = choice.get("text")
        logprobs = completion_logprobs(choice.get("logprobs"))
        if text or logprobs:
            events.append(TextDelta(index, text if isinstance(text, str) else "", logprobs))
        if choice.get("finish_reason"):
            events.append(Finish(index, str(choice["finish_reason"])))
    return events


def coalesced(events: list[Event]) -> list[Event]:
    """The events of one read from a node, with each run of plain text deltas of one choice (text, no
    logprobs) as one `TextRun`; every other event as it was, in the same order."""
    out: list[Event] = []
    for event in events:
        last = out[-1] if out else None
        if _plain(event):
            if isinstance(last, TextRun) and last.index == event.index:
                last.texts.append(event.text)
                continue
            if _plain(last) and last.index == event.index:
                out[-1] = TextRun(event.index, [last.text, event.text])
                continue
        out.append(event)
    return out


def _plain(event: Event | None) -> TypeGuard[TextDelta]:
    return isinstance(event, TextDelta) and bool(event.text) and not event.logprobs


def usage_of(body: dict[str, Any]) -> Usage | None:
    usage = body.get("usage")
    if not isinstance(usage, dict):
        return None
    details = usage.get("prompt_tokens_details")
    cached = details.get("cached_tokens") if isinstance(details, dict) else None
    output_details = usage.get("completion_tokens_details")
    reasoning = output_details.get("reasoning_tokens") if isinstance(output_details, dict) else None
    return Usage(
        prompt_tokens=_int(usage.get("prompt_tokens")),
        completion_tokens=_int(usage.get("completion_tokens")),
        cached_tokens=_int(cached),
        reasoning_tokens=_int(reasoning),
    )


def chat_logprobs(value: Any) -> list[TokenLogprob]:
    content = value.get("content") if isinstance(value, dict) else None
    if not isinstance(content, list):
        return []
    return [
        TokenLogprob(
            token=str(item.get("token", "")),
            logprob=item.get("logprob"),
            bytes=item.get("bytes"),
            top=[_top(t.get("token"), t.get("logprob"), t.get("bytes")) for t in item.get("top_logprobs") or []],
        )
        for item in content
        if isinstance(item, dict)
    ]


def completion_logprobs(value: Any) -> list[TokenLogprob]:
    if not isinstance(value, dict) or not isinstance(value.get("tokens"), list):
        return []
    tokens = value["tokens"]
    values = _padded(value.get("token_logprobs"), len(tokens))
    tops = _padded(value.get("top_logprobs"), len(tokens))
    offsets = _padded(value.get("text_offset"), len(tokens))
    return [
        TokenLogprob(
            token=str(token),
            logprob=values[i],
            bytes=None,
            top=[_top(k, v, None) for k, v in (tops[i] or {}).items()],
            text_offset=_int(offsets[i]),
        )
        for i, token in enumerate(tokens)
    ]


def _tool_calls(index: int, message: dict[str, Any]) -> list[ToolCallDelta]:
    calls = []
    for position, call in enumerate(message.get("tool_calls") or []):
        function = call.get("function") or {}
        calls.append(
            ToolCallDelta(
                index=index,
                call_index=_int(call.get("index", position)),
                id=call.get("id"),
                name=function.get("name"),
                arguments=function.get("arguments") or "",
            )
        )
    legacy = message.get("function_call")
    if isinstance(legacy, dict):
        calls.append(ToolCallDelta(index, 0, None, legacy.get("name"), legacy.get("arguments") or ""))
    return calls


def _choices(body: dict[str, Any]) -> list[dict[str, Any]]:
    choices = body.get("choices")
    return [c for c in choices if isinstance(c, dict)] if isinstance(choices, list) else []


def _top(token: Any, logprob: Any, raw: Any) -> TopLogprob:
    # -9999.0 is what the OpenAI API itself reports for a vanishing probability; JSON has no -Infinity.
    return TopLogprob(token=str(token), logprob=float(logprob) if logprob is not None else -9999.0, bytes=raw)


def _padded(value: Any, length: int) -> list[Any]:
    items = list(value) if isinstance(value, list) else []
    return items + [None] * (length - len(items))


def _int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


class ChatAsCompletion:
    """Reads a node's chat answer as a text completion (for nodes marked `completions_via_chat`).

    Text and finish reasons carry over as they are; chat logprobs lack `text_offset`, so it is counted here,
    per choice, across the chunks of a stream.
    """

    def __init__(self) -> None:
        self.offsets: dict[int, int] = {}

    def __call__(self, body: dict[str, Any], key: str) -> list[Event]:
        return [self._placed(event) for event in chat_events(body, key) if not isinstance(event, DeltaFields)]

    def _placed(self, event: Event) -> Event:
        if not isinstance(event, TextDelta) or not event.logprobs:
            return event
        offset = self.offsets.get(event.index, 0)
        placed = []
        for item in event.logprobs:
            placed.append(replace(item, text_offset=offset))
            offset += len(item.token)
        self.offsets[event.index] = offset
        return TextDelta(event.index, event.text, placed)


def completion_parser(body: dict[str, Any], key: str) -> list[Event]:
    return completion_events(body)
