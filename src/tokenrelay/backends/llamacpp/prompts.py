"""Requests → prompt token ids, with the checks that need the model (vocabulary, context window, FIM)."""

from __future__ import annotations

from typing import Any

from tokenrelay.backends.llamacpp.model import LlamaModel
from tokenrelay.backends.llamacpp.templates import ChatTemplate
from tokenrelay.errors import (
    UNSUPPORTED_CONTENT,
    UNSUPPORTED_PARAMETER,
    ContextExceeded,
    InvalidRequest,
)
from tokenrelay.protocol.chat import ChatCompletionRequest
from tokenrelay.protocol.common import GenerationRequest


def reject_media(request: ChatCompletionRequest) -> None:
    for i, message in enumerate(request.messages):
        kinds = message.media_parts()
        if kinds:
            raise InvalidRequest(
                f"This model is text-only and cannot read {kinds[0]} content parts.",
                param=f"messages.{i}.content",
                code=UNSUPPORTED_CONTENT,
            )


def template_messages(request: ChatCompletionRequest) -> list[dict[str, Any]]:
    """Messages as chat templates expect them: plain dicts with string content."""
    out = []
    for message in request.messages:
        item: dict[str, Any] = {"role": message.role, "content": message.text()}
        if message.name:
            item["name"] = message.name
        for key in ("tool_calls", "tool_call_id", "function_call"):
            value = getattr(message, key, None)
            if value is not None:
                item[key] = value if isinstance(value, str) else _plain(value)
        out.append(item)
    return out


def _plain(value: Any) -> Any:
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value.model_dump(exclude_none=True) if hasattr(value, "model_dump") else value


def chat_prompt(
    model: LlamaModel,
    template: ChatTemplate,
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]] | None,
    continued: bool = False,
    opened: bool = True,
) -> list[int]:
    text = template.render(messages, tools, continued=continued, opened=opened)
    tokens = model.tokenize(text, add_special=False, parse_special=True)
    bos = model.special("bos")
    if model.add_bos and bos is not None and (not tokens or tokens[0] != bos):
        tokens.insert(0, bos)
    return tokens


def text_prompt(model: LlamaModel, prompt: str, suffix: str | None) -> list[int]:
    if suffix is None:
        return model.tokenize(prompt, add_special=True, parse_special=True)
    pre, suf, mid = model.special("fim_pre"), model.special("fim_suf"), model.special("fim_mid")
    if pre is None or suf is None or mid is None:
        raise InvalidRequest(
            "This model has no fill-in-the-middle tokens, so `suffix` is not supported.",
            param="suffix",
            code=UNSUPPORTED_PARAMETER,
        )
    bos = model.special("bos")
    head = [bos] if model.add_bos and bos is not None else []
    body = model.tokenize(prompt, add_special=False, parse_special=False)
    tail = model.tokenize(suffix, add_special=False, parse_special=False)
    return [*head, pre, *body, suf, *tail, mid]


def check_token_ids(model: LlamaModel, tokens: list[int], param: str) -> None:
    bad = [t for t in tokens if t < 0 or t >= model.n_vocab]
    if bad:
        raise InvalidRequest(
            f"Token id {bad[0]} is outside this model's vocabulary (0..{model.n_vocab - 1}).",
            param=param,
            code="invalid_token_id",
        )


def check_logit_bias(model: LlamaModel, request: GenerationRequest) -> None:
    check_token_ids(model, list(request.bias_by_token), "logit_bias")


def check_context(prompt_tokens: int, max_tokens: int, n_ctx: int, prompt_param: str) -> None:
    """The prompt must leave room for at least one generated token, and for `max_tokens` of them."""
    if prompt_tokens >= n_ctx or prompt_tokens + max_tokens > n_ctx:
        raise ContextExceeded(prompt_tokens, max_tokens, n_ctx, param=prompt_param)
