"""The most tokens a request can use, reserved on admission and settled to the real count at the end.

The prompt is not tokenised here (only the backend knows its tokenizer and chat template), so its size is
bounded instead (`tokens.ByteBound`): byte-level BPE and SentencePiece-with-byte-fallback tokenizers never
produce more tokens than the UTF-8 bytes of the text, plus the special tokens they or the chat template add.
Every text a chat template renders (contents, names, tool definitions and calls) is inside the JSON of the
request's messages and tools (and of fields unknown here, which a node's template may read), so that JSON's byte
length bounds the rendered text, without the other fields' names, defaults and nulls; allowances cover the role
markers a template adds, the instructions a template without tools gets, and the syntax of a written call.
"""

from __future__ import annotations

from dataclasses import dataclass

from tokenrelay.backends.tokens import ByteBound, text_tokens
from tokenrelay.protocol.chat import ChatCompletionRequest
from tokenrelay.protocol.common import GenerationRequest
from tokenrelay.protocol.completions import CompletionRequest
from tokenrelay.protocol.embeddings import EmbeddingRequest

Admitted = GenerationRequest | EmbeddingRequest  # what admission can bound

TEMPLATE_TOKENS = 64  # BOS, generation prompt and any fixed preamble of a chat template
MESSAGE_TOKENS = 16  # turn markers and separators around one message
TOOL_TOKENS = 256  # the instructions on calling that a template without tools gets (the engine's `toolprompt`)
CALL_TOKENS = 16  # the markers around one tool call written into the conversation
RENDERED = {"messages", "tools", "functions"}  # what a chat template reads, beside fields unknown here
PROMPT_SPECIALS = 2  # BOS/EOS a tokenizer may add to a text prompt

_TEXT = ByteBound()  # text within a prompt (the request's JSON, a suffix)
_PROMPT = ByteBound(PROMPT_SPECIALS)  # a whole text prompt or input


def prompt_bound(body: Admitted) -> int:
    if isinstance(body, ChatCompletionRequest):
        return chat_prompt_bound(body)
    if isinstance(body, CompletionRequest):
        suffix = _TEXT.count(body.suffix or "")
        return sum(text_tokens(p, _PROMPT) + suffix for p in body.prompts)
    if isinstance(body, EmbeddingRequest):
        return sum(text_tokens(item, _PROMPT) for item in body.inputs)
    raise TypeError(f"no token bound for {type(body).__name__}")


def chat_prompt_bound(body: ChatCompletionRequest) -> int:
    read = RENDERED | set(body.model_extra or {})
    text = _TEXT.count(body.model_dump_json(include=read, exclude_none=True))
    calls = sum(len(getattr(message, "tool_calls", None) or []) for message in body.messages)
    tools = TOOL_TOKENS if body.tools or body.functions else 0
    return text + MESSAGE_TOKENS * len(body.messages) + CALL_TOKENS * calls + tools + TEMPLATE_TOKENS


def completion_bound(body: Admitted, context_length: int) -> int:
    """Completion tokens at most: every generated sequence (best_of candidates too) up to its limit."""
    if isinstance(body, EmbeddingRequest):
        return 0  # an embedding generates nothing
    if isinstance(body, ChatCompletionRequest):
        limit = body.token_limit
        return body.choices * (limit if limit is not None else context_length)
    if isinstance(body, CompletionRequest):
        return len(body.prompts) * body.candidates * body.token_limit
    raise TypeError(f"no token bound for {type(body).__name__}")


@dataclass(frozen=True, slots=True)
class TokenBound:
    prompt: int
    completion: int

    @property
    def total(self) -> int:
        return self.prompt + self.completion


@dataclass(frozen=True, slots=True)
class Charge:
    """The most a request can take from its key: tokens (the token bucket and budget) and money (micro-units)."""

    tokens: int
    micros: int = 0
