"""`POST /v1/completions` request body."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field, field_validator, model_validator

from tokenrelay.errors import InvalidRequest
from tokenrelay.protocol.common import GenerationRequest, texts_or_token_lists

DEFAULT_MAX_TOKENS = 16
TokenIds = Annotated[list[int], Field(min_length=1)]
Prompt = str | Annotated[list[str], Field(min_length=1)] | TokenIds | Annotated[list[TokenIds], Field(min_length=1)]


class CompletionRequest(GenerationRequest):
    prompt: Prompt
    best_of: Annotated[int, Field(ge=1)] | None = None
    echo: bool | None = None
    logprobs: Annotated[int, Field(ge=0, le=20)] | None = None
    suffix: str | None = None

    @field_validator("prompt")
    @classmethod
    def _prompt_not_empty(cls, value: Prompt) -> Prompt:
        if isinstance(value, list) and not value:
            raise ValueError("prompt must not be an empty list")
        if isinstance(value, list) and any(isinstance(p, list) and not p for p in value):
            raise ValueError("token prompts must not be empty")
        return value

    @model_validator(mode="after")
    def _best_of_rules(self) -> CompletionRequest:
        if self.best_of is None:
            return self
        if self.best_of < self.choices:
            raise InvalidRequest(
                f"best_of ({self.best_of}) must be greater than or equal to n ({self.choices})",
                param="best_of",
            )
        if self.stream and self.best_of > self.choices:
            raise InvalidRequest("best_of greater than n cannot be used with stream", param="best_of")
        return self

    @property
    def prompts(self) -> list[str | list[int]]:
        """The prompt as a list of prompts (strings or token-id lists)."""
        return texts_or_token_lists(self.prompt)

    @property
    def token_limit(self) -> int:
        """`max_tokens`, or the completions API's documented default of 16."""
        return self.max_tokens if self.max_tokens is not None else DEFAULT_MAX_TOKENS

    @property
    def candidates(self) -> int:
        return self.best_of or self.choices
