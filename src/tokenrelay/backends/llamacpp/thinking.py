"""Generated text → reasoning and answer, for models whose chat template has a thinking section.

Reasoning models (Qwen3, DeepSeek-R1 and their distillations, ...) write `<think>...</think>` before the answer;
their templates either leave the model to open the section or open it in the generation prompt. What is inside
becomes `reasoning_content` (`DeltaFields`), which every API renders as its own reasoning (a chat delta field,
an Anthropic `thinking` block, a Responses `reasoning` item), as it does for a node's reasoning; the rest is the
answer. A tag split across tokens is held back until it is whole. The request's usage counts the reasoning's
tokens (`reasoning_tokens`) by the model's tokenizer, as the text of the section would be tokenized.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Callable
from contextlib import aclosing
from enum import Enum

from tokenrelay.backends.base import DeltaFields, Event, Finish, TextDelta, Usage
from tokenrelay.backends.llamacpp.textstream import partial_match

OPEN, CLOSE = "<think>", "</think>"


def thinks(template_source: str) -> bool:
    """Whether a chat template has a thinking section."""
    return OPEN in template_source and CLOSE in template_source


def opened_by(prompt_text: str) -> bool:
    """Whether the generation prompt itself opened the thinking section (the model then writes only its end)."""
    return prompt_text.rstrip().endswith(OPEN)


class Part(Enum):
    START = "start"  # nothing decided yet: the answer may open with the tag
    THINKING = "thinking"
    ANSWER = "answer"


class ThinkingSplitter:
    """One choice's text, split as it arrives."""

    def __init__(self, index: int, opened: bool) -> None:
        self.index = index
        self.part = Part.THINKING if opened else Part.START
        self.held = ""
        self.reasoning: list[str] = []  # what the section held, for counting its tokens

    def feed(self, delta: TextDelta) -> list[Event]:
        if self.part is Part.ANSWER and not self.held:
            return [delta]
        self.held += delta.text
        out: list[Event] = []
        if self.part is Part.START:
            start = self.held.lstrip()
            if start.startswith(OPEN):
                self.part, self.held = Part.THINKING, start[len(OPEN) :]
            elif OPEN.startswith(start):
                return out  # maybe the tag, not yet whole
            else:
                self.part = Part.ANSWER
                if self.held == delta.text:  # nothing was held before: the delta goes on as it is (logprobs too)
                    self.held = ""
                    return [delta]
        if self.part is Part.THINKING:
            end = self.held.find(CLOSE)
            if end < 0:
                keep = partial_match(self.held, [CLOSE])
                out += self._reasoning(self.held[: len(self.held) - keep])
                self.held = self.held[len(self.held) - keep :]
                return out
            out += self._reasoning(self.held[:end])
            self.part, self.held = Part.ANSWER, self.held[end + len(CLOSE) :].lstrip("\n")
        if self.held:
            out.append(TextDelta(self.index, self.held))
            self.held = ""
        return out

    def finish(self, finish: Finish) -> list[Event]:
        """What was held back (a tag never completed is text of its part), then the finish."""
        held, self.held = self.held, ""
        if not held:
            return [finish]
        if self.part is Part.THINKING:
            return [*self._reasoning(held), finish]
        return [TextDelta(self.index, held), finish]

    def _reasoning(self, text: str) -> list[Event]:
        if not text:
            return []
        self.reasoning.append(text)
        return [DeltaFields(self.index, {"reasoning_content": text})]


async def thinking_events(
    events: AsyncGenerator[Event, None], opened: bool, count: Callable[[str], int]
) -> AsyncGenerator[Event, None]:
    """The engine's events with each choice's thinking section turned into reasoning, and the reasoning's
    tokens (`count`) in the usage."""
    splitters: dict[int, ThinkingSplitter] = {}
    async with aclosing(events):
        async for event in events:
            if isinstance(event, Usage):
                reasoned = sum(count("".join(splitter.reasoning)) for splitter in splitters.values())
                event.reasoning_tokens = min(reasoned, event.completion_tokens)
                outs: list[Event] = [event]
            elif isinstance(event, TextDelta):
                outs = splitters.setdefault(event.index, ThinkingSplitter(event.index, opened)).feed(event)
            elif isinstance(event, Finish):
                outs = splitters.setdefault(event.index, ThinkingSplitter(event.index, opened)).finish(event)
            else:
                outs = [event]
            for out in outs:
                yield out
