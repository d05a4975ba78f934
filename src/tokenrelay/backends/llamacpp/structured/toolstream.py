"""Generated text → answer text and tool-call deltas, as it is generated.

The scheduler knows only text; this layer, between the engine and the renderer, reads each choice's text in
the `toolformat` convention. Text before a call is the answer (`content`); a call yields a first delta with
its id and name as soon as the name is complete, then its arguments in the fragments they were generated in.
The grammar guarantees the envelope, so the parser only has to find where the arguments end: at the first
`}` or `]` outside a string at nesting depth zero, which is the envelope's own closing brace. A text call
(`toolformat.text_head`) ends at the closing marker; its text goes out as the arguments `{"input": text}`, escaped
piece by piece, the shape a custom tool's call has on every backend.
"""

from __future__ import annotations

import json
import re
import secrets
from collections.abc import AsyncGenerator
from contextlib import aclosing
from enum import Enum

from tokenrelay.backends.base import Event, Finish, TextDelta, TokenLogprob, ToolCallDelta
from tokenrelay.backends.llamacpp.structured import toolformat
from tokenrelay.backends.llamacpp.structured.toolspec import ToolSpec
from tokenrelay.backends.llamacpp.textstream import partial_match

NAME = r'\{"name":("(?:[^"\\]|\\.)*")'
HEAD = re.compile(re.escape(toolformat.OPEN) + NAME + ',"arguments":')
TEXT_HEAD = re.compile(re.escape(toolformat.OPEN) + NAME + r"\}\n")


def new_call_id() -> str:
    return "call_" + secrets.token_hex(12)


class Part(Enum):
    TEXT = "text"  # answer text, before any call
    HEAD = "head"  # inside the envelope, before the arguments
    ARGUMENTS = "arguments"
    INPUT = "input"  # a text call's text, up to the closing marker
    TAIL = "tail"  # after the arguments, up to the closing marker
    BETWEEN = "between"  # after a call: another call, or the end


class ArgumentsEnd:
    """Finds where a JSON value ends when it is followed by a closing bracket, one character at a time."""

    def __init__(self) -> None:
        self.depth = 0
        self.in_string = False
        self.escaped = False

    def at(self, char: str) -> bool:
        """Consume `char`; True when it is the closer just after the value (and so not part of it)."""
        if self.in_string:
            if self.escaped:
                self.escaped = False
            elif char == "\\":
                self.escaped = True
            elif char == '"':
                self.in_string = False
            return False
        if char == '"':
            self.in_string = True
        elif char in "{[":
            self.depth += 1
        elif char in "}]":
            if self.depth == 0:
                return True
            self.depth -= 1
        return False


class ToolCallParser:
    """One choice's output, split into answer text and tool calls."""

    def __init__(self, index: int, spec: ToolSpec) -> None:
        self.index = index
        self.spec = spec
        self.part = Part.TEXT
        self.calls = 0  # calls started
        self._buffer = ""
        self._logprobs: list[TokenLogprob] = []
        self._end = ArgumentsEnd()

    def feed(self, text: str, logprobs: list[TokenLogprob] | None = None) -> list[Event]:
        self._buffer += text
        self._logprobs.extend(logprobs or [])
        out: list[Event] = []
        while self._step(out):
            pass
        return out

    def finish(self, reason: str) -> list[Event]:
        """Release held-back text; a clean end after complete calls is reported as a tool-call finish."""
        out: list[Event] = []
        if self.part is Part.TEXT and (self._buffer or self._logprobs):
            out.append(self._text(self._buffer))
        if reason == "stop" and self.calls and self.part is Part.BETWEEN:
            reason = self.spec.finish_reason
        out.append(Finish(self.index, reason))
        return out

    def _step(self, out: list[Event]) -> bool:
        """Advance through the buffer; False when more text is needed."""
        handler = {
            Part.TEXT: self._in_text,
            Part.HEAD: self._in_head,
            Part.ARGUMENTS: self._in_arguments,
            Part.INPUT: self._in_input,
            Part.TAIL: self._in_tail,
            Part.BETWEEN: self._between,
        }[self.part]
        return handler(out)

    def _in_text(self, out: list[Event]) -> bool:
        start = self._buffer.find(toolformat.OPEN)
        if start < 0:
            ready = len(self._buffer) - partial_match(self._buffer, [toolformat.OPEN])
            if ready:
                out.append(self._text(self._buffer[:ready]))
                self._buffer = self._buffer[ready:]
            return False
        if start:
            out.append(self._text(self._buffer[:start]))
        # Tokens that wrote the call carry no logprobs: `logprobs.content` describes the answer text only.
        self._logprobs = []
        self._buffer, self.part = self._buffer[start:], Part.HEAD
        return True

    def _in_head(self, out: list[Event]) -> bool:
        found = HEAD.match(self._buffer) or TEXT_HEAD.match(self._buffer)
        if found is None:
            return False
        name = json.loads(found.group(1))
        out.append(ToolCallDelta(self.index, self.calls, id=new_call_id(), name=name))
        self.calls += 1
        self._buffer = self._buffer[found.end() :]
        if found.re is TEXT_HEAD:
            out.append(ToolCallDelta(self.index, self.calls - 1, arguments='{"input":"'))
            self.part = Part.INPUT
        else:
            self.part, self._end = Part.ARGUMENTS, ArgumentsEnd()
        return True

    def _in_input(self, out: list[Event]) -> bool:
        end = self._buffer.find(toolformat.CLOSE)
        ready = end if end >= 0 else len(self._buffer) - partial_match(self._buffer, [toolformat.CLOSE])
        piece = json.dumps(self._buffer[:ready], ensure_ascii=False)[1:-1]
        if end < 0:
            if piece:
                out.append(ToolCallDelta(self.index, self.calls - 1, arguments=piece))
            self._buffer = self._buffer[ready:]
            return False
        out.append(ToolCallDelta(self.index, self.calls - 1, arguments=piece + '"}'))
        self._buffer, self.part = self._buffer[end + len(toolformat.CLOSE) :], Part.BETWEEN
        return True

    def _in_arguments(self, out: list[Event]) -> bool:
        size = next((i for i, char in enumerate(self._buffer) if self._end.at(char)), None)
        piece = self._buffer if size is None else self._buffer[:size]
        if piece:
            out.append(ToolCallDelta(self.index, self.calls - 1, arguments=piece))
        if size is None:
            self._buffer = ""
            return False
        self._buffer, self.part = self._buffer[size:], Part.TAIL
        return True

    def _in_tail(self, out: list[Event]) -> bool:
        if not self._buffer.startswith(toolformat.TAIL):
            return False
        self._buffer, self.part = self._buffer[len(toolformat.TAIL) :], Part.BETWEEN
        return True

    def _between(self, out: list[Event]) -> bool:
        if self._buffer.startswith(toolformat.OPEN):
            self.part = Part.HEAD
            return True
        return False

    def _text(self, text: str) -> TextDelta:
        delta = TextDelta(self.index, text, self._logprobs)
        self._logprobs = []
        return delta


async def tool_events(events: AsyncGenerator[Event, None], spec: ToolSpec) -> AsyncGenerator[Event, None]:
    """The engine's events with each choice's text read for tool calls."""
    parsers: dict[int, ToolCallParser] = {}
    async with aclosing(events):
        async for event in events:
            if isinstance(event, TextDelta):
                outs = parsers.setdefault(event.index, ToolCallParser(event.index, spec)).feed(
                    event.text, event.logprobs
                )
            elif isinstance(event, Finish):
                outs = parsers.setdefault(event.index, ToolCallParser(event.index, spec)).finish(event.reason)
            else:
                outs = [event]
            for out in outs:
                yield out
