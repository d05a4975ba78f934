"""The `/v1/embeddings` request, as the API validates it and the backends receive it."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import ConfigDict, Field, field_validator, model_validator

from tokenrelay.errors import InvalidRequest
from tokenrelay.protocol.common import WireModel, texts_or_token_lists

MAX_INPUTS = 2048  # the OpenAI API's limit on inputs per request

Text = Annotated[str, Field(min_length=1)]
TokenIds = Annotated[list[Annotated[int, Field(ge=0)]], Field(min_length=1)]
EmbeddingInput = (
    Text
    | Annotated[list[Text], Field(min_length=1, max_length=MAX_INPUTS)]
    | TokenIds
    | Annotated[list[TokenIds], Field(min_length=1, max_length=MAX_INPUTS)]
)


class EmbeddingRequest(WireModel):
    """`input` is one text, several texts, one token-id list or several; `dimensions` shortens the vectors
    of a model whose settings say its embeddings may be truncated."""

    # Unknown fields are refused (below), so the document says so.
    model_config = ConfigDict(json_schema_extra={"additionalProperties": False})

    model: Annotated[str, Field(min_length=1)]
    input: EmbeddingInput
    encoding_format: Literal["float", "base64"] | None = None
    dimensions: Annotated[int, Field(ge=1)] | None = None
    user: str | None = None

    @field_validator("input")
    @classmethod
    def _nothing_empty(cls, value: EmbeddingInput) -> EmbeddingInput:
        items = [value] if isinstance(value, str) else value
        if not items:
            raise ValueError("input must not be empty")
        if len(items) > MAX_INPUTS and not isinstance(items[0], int):
            raise ValueError(f"at most {MAX_INPUTS} inputs are allowed per request, got {len(items)}")
        if any(isinstance(item, str | list) and len(item) == 0 for item in items):
            raise ValueError("input must not contain an empty string or an empty token list")
        return value

    @model_validator(mode="after")
    def _no_unknown_fields(self) -> EmbeddingRequest:
        # Unlike the generation endpoints (whose extras nodes may understand), every field here is known:
        # a misspelt `dimension` or `encoding` would otherwise be silently ignored.
        unknown = self.extra_fields()
        if unknown:
            names = ", ".join(f"`{name}`" for name in unknown)
            raise InvalidRequest(f"Unknown field(s) for /v1/embeddings: {names}.", param=unknown[0])
        return self

    @property
    def inputs(self) -> list[str | list[int]]:
        """One entry per embedding to return, in order: a text or a token-id list."""
        return texts_or_token_lists(self.input)

    @property
    def base64(self) -> bool:
        return self.encoding_format == "base64"

    def extra_fields(self) -> list[str]:
        return sorted((self.model_extra or {}).keys())
