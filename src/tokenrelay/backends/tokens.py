"""Token counts made without running the model: what an event of an answer stands for, what a text or a prompt is.

The one rule for events serves both the call's record of what was generated (`calls/record.py`) and the hold
of a node's answer to the client's limit (`upstream/cutoff.py`). Texts are counted by a `TokenCounter`: an
estimate (`ApproxCounter`), the model's own tokenizer (`EngineCounter`), or a bound (`ByteBound`, for what
admission reserves); a prompt's token ids always count exactly.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from tokenrelay.backends.base import DeltaFields, Event, TextDelta, TextRun, ToolCallDelta
from tokenrelay.jsonbytes import dumps
from tokenrelay.protocol.chat import ChatCompletionRequest
from tokenrelay.protocol.common import GenerationRequest
from tokenrelay.protocol.completions import CompletionRequest

if TYPE_CHECKING:
    from tokenrelay.backends.llamacpp.engine import LlamaCppBackend

# Template tokens a chat turn costs besides its text (role markers, separators): a typical figure.
TOKENS_PER_TURN = 4


def event_tokens(event: Event) -> int:
    """The generated tokens `event` stands for, never more than were generated.

    With logprobs each token is listed. Otherwise a piece of output (a text, a tool call's name or arguments,
    a field such as `reasoning_content`) is released once a generated token completes some of it, so it is at
    least one token; this undercounts only tokens that end mid-character or inside a held-back stop string.
    """
    if isinstance(event, TextDelta):
        return len(event.logprobs) if event.logprobs else int(bool(event.text))
    if isinstance(event, TextRun):
        return len(event.texts)
    if isinstance(event, ToolCallDelta):
        return int(bool(event.name or event.arguments))
    if isinstance(event, DeltaFields):
        return 1
    return 0


class TokenCounter(Protocol):
    def count(self, text: str) -> int: ...


class ApproxCounter:
    """About four bytes of UTF-8 per token: the usual ratio of BPE vocabularies on English text.

    Used when no tokenizer of the model is at hand (an upstream-only model); the ledger row says so.
    """

    def count(self, text: str) -> int:
        return (len(text.encode()) + 3) // 4


class ByteBound:
    """At most one token per UTF-8 byte, plus the `specials` (BOS/EOS) a tokenizer may add: byte-level BPE and
    SentencePiece-with-byte-fallback tokenizers never make more of a text, so the count is an upper bound."""

    def __init__(self, specials: int = 0) -> None:
        self.specials = specials

    def count(self, text: str) -> int:
        return len(text.encode()) + self.specials


class EngineCounter:
    """Counts with the tokenizer of the model's embedded engine: exact when a model is served both ways."""

    def __init__(self, engine: LlamaCppBackend) -> None:
        self.engine = engine
        self.fallback = ApproxCounter()

    def count(self, text: str) -> int:
        model = self.engine.model
        if model is None:  # not loaded (yet)
            return self.fallback.count(text)
        return model.count(text)


def text_tokens(prompt: str | list[int], counter: TokenCounter) -> int:
    """One prompt or input: token ids count exactly, a text as `counter` counts it."""
    return len(prompt) if isinstance(prompt, list) else counter.count(prompt)


def prompt_tokens(request: GenerationRequest, counter: TokenCounter) -> int:
    """An estimate of a request's prompt: the text of its messages or prompts, its tools' definitions, and what
    a chat template typically adds per turn."""
    if isinstance(request, ChatCompletionRequest):
        tools = (
            counter.count(dumps([tool.model_dump(mode="json") for tool in request.tools]).decode())
            if request.tools
            else 0
        )
        return tools + sum(counter.count(m.text()) + TOKENS_PER_TURN for m in request.messages)
    if isinstance(request, CompletionRequest):
        return sum(text_tokens(p, counter) for p in request.prompts)
    return 0
