"""The client's completion-token limit, enforced on a node's answer as well as asked of the node.

A node that ignores or misreads the limit would otherwise stream (and bill) tokens the client never asked for.
Each choice's tokens are counted as they pass, by the rule the call's record counts with (`tokens.event_tokens`):
a logprob entry is one token, and a delta without logprobs is at least one (a node sends text at token boundaries,
or later), so a count never runs ahead of the node's. A choice
that runs past the limit is ended here with `length` and the rest of it dropped; once every choice has ended, one
of them here, the relay stops reading, which closes the node's connection and so stops its generation. A whole
answer (not a stream) arrives at once: when its usage says it ran past the limit, each choice's text is cut to the
longest prefix the token counter counts within the limit. Usage is never billed beyond the limit.
"""

from __future__ import annotations

from dataclasses import replace

from tokenrelay.backends.base import Event, Finish, TextDelta, TextRun, Usage
from tokenrelay.backends.tokens import TokenCounter, event_tokens
from tokenrelay.protocol.chat import ChatCompletionRequest
from tokenrelay.protocol.common import GenerationRequest
from tokenrelay.protocol.completions import CompletionRequest


def token_limit(request: GenerationRequest) -> int | None:
    """The completion tokens a choice may have; None when only the context bounds it."""
    if isinstance(request, ChatCompletionRequest | CompletionRequest):
        return request.token_limit
    return None


class Cutoff:
    """One answer's choices held to `limit` tokens each."""

    def __init__(self, request: GenerationRequest, counter: TokenCounter) -> None:
        # An echoed prompt comes back as text that is not completion: such answers are left to the node.
        echo = isinstance(request, CompletionRequest) and bool(request.echo)
        self.limit = None if echo else token_limit(request)
        self.counter = counter
        prompts = len(request.prompts) if isinstance(request, CompletionRequest) else 1
        self.choices = prompts * request.choices
        candidates = request.candidates if isinstance(request, CompletionRequest) else request.choices
        self.billable = None if self.limit is None else self.limit * prompts * candidates
        self.counts: dict[int, int] = {}
        self.ended: set[int] = set()
        self.cut: set[int] = set()

    @property
    def done(self) -> bool:
        """Every choice has ended and one was cut here: the rest of the answer is not wanted. (A node that ended
        every choice itself is read to its end, for the usage it sends last.)"""
        return bool(self.cut) and len(self.ended) >= self.choices

    def passed(self, events: list[Event], whole: bool = False) -> list[Event]:
        """The events of one read (`whole`: the node's whole answer) held to the limit."""
        if self.limit is None:
            return events
        overspent = whole and self._overspent(events)
        out: list[Event] = []
        for event in events:
            index = getattr(event, "index", None)
            if index is None or isinstance(event, Usage):
                out.append(event)
            elif index not in self.cut:
                out += self._counted(event, index, overspent)
        return out

    def billed(self, usage: Usage) -> Usage:
        """`usage` with completion tokens never beyond the limit (an estimate made after a cut counts what passed)."""
        if self.billable is None:
            return usage
        completion = usage.completion_tokens
        if self.cut and usage.estimated:
            completion = sum(self.counts.values())
        return replace(usage, completion_tokens=min(completion, self.billable))

    def _overspent(self, events: list[Event]) -> bool:
        usage = next((event for event in events if isinstance(event, Usage)), None)
        return usage is not None and self.billable is not None and usage.completion_tokens > self.billable

    def _counted(self, event: Event, index: int, overspent: bool) -> list[Event]:
        if isinstance(event, Finish):
            self.ended.add(index)
            return [event]
        limit = self.limit or 0
        left = limit - self.counts.get(index, 0)
        kept: Event | None
        if overspent and isinstance(event, TextDelta) and not event.logprobs:
            kept = self._shortened(event, left)
            used = 0 if kept is None else self.counter.count(kept.text)
        else:
            kept = _within(event, left)
            used = 0 if kept is None else event_tokens(kept)
        if kept is None:
            return self._end(index)
        self.counts[index] = self.counts.get(index, 0) + used
        # At the limit the node's own finish is awaited; only more than the limit ends the choice here.
        return [kept] if kept is event else [kept, *self._end(index)]

    def _shortened(self, event: TextDelta, left: int) -> TextDelta | None:
        """A whole answer's text, cut to the longest prefix the counter counts within `left` tokens."""
        text = event.text
        if self.counter.count(text) <= left:
            return event
        low, high = 0, len(text)
        while low < high:
            middle = (low + high + 1) // 2
            if self.counter.count(text[:middle]) <= left:
                low = middle
            else:
                high = middle - 1
        return TextDelta(event.index, text[:low]) if low else None

    def _end(self, index: int) -> list[Event]:
        self.cut.add(index)
        self.ended.add(index)
        return [Finish(index, "length")]


def _within(event: Event, left: int) -> Event | None:
    """`event`, or its first `left` tokens when it holds more; None when no token of it fits."""
    tokens = event_tokens(event)
    if tokens <= left:
        return event
    if left <= 0:
        return None
    if isinstance(event, TextRun):
        return TextRun(event.index, event.texts[:left])
    if isinstance(event, TextDelta):  # with logprobs: one entry per token
        kept = event.logprobs[:left]
        return TextDelta(event.index, "".join(item.token for item in kept), kept)
    return None
