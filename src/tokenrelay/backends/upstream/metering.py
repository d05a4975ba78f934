"""Usage for the ledger when a node reports none: tokens counted locally, marked as estimated.

A node's own usage always wins. It is held back until the stream ends so that the usage event comes last,
whatever chunk the node put it in.
"""

from __future__ import annotations

from tokenrelay.backends.base import Event, TextDelta, TextRun, ToolCallDelta, Usage
from tokenrelay.backends.tokens import TokenCounter, prompt_tokens
from tokenrelay.backends.upstream.cutoff import Cutoff
from tokenrelay.protocol.chat import ChatCompletionRequest
from tokenrelay.protocol.common import GenerationRequest
from tokenrelay.protocol.completions import CompletionRequest


def prompt_text(request: GenerationRequest) -> str:
    """The prompt as one string: what prefix affinity keys on."""
    if isinstance(request, ChatCompletionRequest):
        return "".join(f"{m.role}\n{m.text()}\n" for m in request.messages)
    if isinstance(request, CompletionRequest):
        prompt = request.prompt
        return prompt if isinstance(prompt, str) else str(prompt)
    return ""


# Before a node has answered: the assistant turn's opening, which every chat template writes.
_GENERATION_PROMPT_TOKENS = 3


class TemplateAllowance:
    """What a node's chat template adds to a prompt besides the messages' text: turn markers, and the default
    system prompt some templates write when a request has none. Learned from the node's own usage (the last
    difference between its prompt count and the text's estimate), apart for requests with and without a system
    message; before the node has answered, only the generation prompt's typical cost."""

    def __init__(self, counter: TokenCounter) -> None:
        self.counter = counter
        self.fixed: dict[bool, int] = {}

    def estimate(self, request: ChatCompletionRequest) -> int:
        return prompt_tokens(request, self.counter) + self.fixed.get(_has_system(request), _GENERATION_PROMPT_TOKENS)

    def learn(self, request: GenerationRequest, usage: Usage) -> None:
        if isinstance(request, ChatCompletionRequest) and not usage.estimated and usage.prompt_tokens:
            self.fixed[_has_system(request)] = max(0, usage.prompt_tokens - prompt_tokens(request, self.counter))


def _has_system(request: ChatCompletionRequest) -> bool:
    return any(message.role in ("system", "developer") for message in request.messages)


class Meter:
    """Watches what a node sent, to estimate usage if the node reports none, and holds the answer to the
    client's token limit (`cutoff.py`)."""

    def __init__(
        self, request: GenerationRequest, counter: TokenCounter, template: TemplateAllowance | None = None
    ) -> None:
        self.request = request
        self.counter = counter
        self.template = template  # learns from the node's usage, when given
        self.cutoff = Cutoff(request, counter)
        self.pieces: list[str] = []
        self.reported: Usage | None = None

    def saw(self, event: Event) -> None:
        if isinstance(event, TextDelta):
            self.pieces.append(event.text)
        elif isinstance(event, TextRun):
            self.pieces.extend(event.texts)
        elif isinstance(event, ToolCallDelta):
            self.pieces.append((event.name or "") + event.arguments)

    @property
    def done(self) -> bool:
        """Every choice has ended: the rest of the node's answer is not needed."""
        return self.cutoff.done

    def passed(self, events: list[Event], whole: bool = False) -> list[Event]:
        """The events to pass on, within the limit (`whole`: the node's whole answer): a node's usage is kept
        for the end (`usage`), every other event watched."""
        kept: list[Event] = []
        for event in self.cutoff.passed(events, whole):
            if isinstance(event, Usage):
                self.reported = event
                if self.template is not None:
                    self.template.learn(self.request, event)
            else:
                self.saw(event)
                kept.append(event)
        return kept

    def usage(self) -> Usage:
        """The node's usage, or an estimate from what it sent when it reported none; never beyond the limit."""
        if self.reported is not None:
            return self.cutoff.billed(self.reported)
        estimate = Usage(
            prompt_tokens=prompt_tokens(self.request, self.counter),
            completion_tokens=self.counter.count("".join(self.pieces)),
            estimated=True,
        )
        return self.cutoff.billed(estimate)
