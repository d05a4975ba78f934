"""What every dialect's rendering shares: a stream chunk's type, a generation's events gathered for a whole
(non-streamed) answer, and a stream's chunks made batch by batch."""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

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
    aclose_quietly,
)

# One stream chunk's body, before it is encoded and framed.
Chunk = dict[str, Any]
# The fields in which OpenAI-compatible servers stream a reasoning model's thinking (`DeltaFields`).
REASONING_FIELDS = ("reasoning_content", "reasoning")


def reasoning_text(fields: dict[str, Any]) -> str:
    """The reasoning in a delta's fields (a server that sends both names sends the same text in each)."""
    return next((value for name in REASONING_FIELDS if isinstance(value := fields.get(name), str)), "")


@dataclass(slots=True)
class ChoiceState:
    text: list[str] = field(default_factory=list)
    logprobs: list[TokenLogprob] = field(default_factory=list)
    tool_calls: dict[int, ToolCallDelta] = field(default_factory=dict)
    finish_reason: str | None = None
    stop_sequence: str | None = None
    extras: dict[str, Any] = field(default_factory=dict)

    def add_fields(self, fields: dict[str, Any]) -> None:
        # Streamed string fields (e.g. `reasoning_content`) arrive in pieces, like `content`; others replace.
        for name, value in fields.items():
            before = self.extras.get(name)
            both_text = isinstance(before, str) and isinstance(value, str)
            self.extras[name] = before + value if both_text else value


@dataclass(slots=True)
class Collected:
    """Everything a backend yielded for one request, gathered for a non-streamed response."""

    choices: dict[int, ChoiceState] = field(default_factory=dict)
    usage: Usage = field(default_factory=Usage)

    def choice(self, index: int) -> ChoiceState:
        state = self.choices.get(index)  # not `setdefault`, which would build a ChoiceState for every event
        if state is None:
            state = self.choices[index] = ChoiceState()
        return state

    def add(self, event: Event) -> None:
        if isinstance(event, TextDelta):
            state = self.choice(event.index)
            state.text.append(event.text)
            state.logprobs.extend(event.logprobs)
        elif isinstance(event, TextRun):
            self.choice(event.index).text.extend(event.texts)
        elif isinstance(event, ToolCallDelta):
            self._add_tool_call(event)
        elif isinstance(event, Finish):
            state = self.choice(event.index)
            state.finish_reason, state.stop_sequence = event.reason, event.stop_sequence
        elif isinstance(event, Usage):
            self.usage = event
        elif isinstance(event, DeltaFields):
            self.choice(event.index).add_fields(event.fields)

    def _add_tool_call(self, event: ToolCallDelta) -> None:
        calls = self.choice(event.index).tool_calls
        call = calls.setdefault(event.call_index, ToolCallDelta(event.index, event.call_index))
        call.id = call.id or event.id
        call.name = call.name or event.name
        call.arguments += event.arguments


async def collect(batches: AsyncIterator[Events]) -> Collected:
    collected = Collected()
    async for events in batches:
        for event in events:
            collected.add(event)
    return collected


async def chunk_batches(
    batches: AsyncIterator[Events], render: Callable[[Event], list[Chunk]], opening: Callable[[], list[Chunk]]
) -> AsyncGenerator[list[Chunk], None]:
    """The chunks of each batch that shows in the stream, batch by batch; closing this closes `batches`.

    `opening()` (chat's role chunks) goes out with the first chunks of content, not before, so that a request
    the backend rejects (context too long, unsupported field) still gets a plain HTTP error; it is made then
    too, once the first batch has said which model serves (a fallback's chunks name it)."""
    opened = False
    try:
        async for events in batches:
            chunks = [chunk for event in events for chunk in render(event)]
            if chunks:
                if not opened:
                    chunks, opened = opening() + chunks, True
                yield chunks
        if not opened and (first := opening()):
            yield first  # the backend produced nothing to show
    finally:
        await aclose_quietly(batches)
