"""Fields shared by both generation endpoints, with the OpenAI API's ranges."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

from tokenrelay.durations import KeepAlive
from tokenrelay.errors import InvalidRequest

MAX_STOP_SEQUENCES = 4
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1

Penalty = Annotated[float, Field(ge=-2.0, le=2.0)]
StopSequence = Annotated[str, Field(min_length=1)]
TokenId = Annotated[str, Field(pattern=r"^[0-9]+$")]


def requires(field: str, other: str, value: object = True) -> dict[str, Any]:
    """A JSON Schema rule of the published document: a non-null `field` needs `other` set to `value`."""
    return {
        "if": {"required": [field], "properties": {field: {"not": {"type": "null"}}}},
        "then": {"required": [other], "properties": {other: {"const": value}}},
    }


STREAM_OPTIONS_NEED_STREAM = requires("stream_options", "stream")


def texts_or_token_lists(value: str | list[str] | list[int] | list[list[int]]) -> list[str | list[int]]:
    """A prompt or input field as its items: one text, several texts, one token-id list or several."""
    if isinstance(value, str):
        return [value]
    token_ids = [item for item in value if isinstance(item, int)]
    if token_ids:  # a validated list holds token ids only, or no token id at all
        return [token_ids]
    return [item for item in value if not isinstance(item, int)]


class WireModel(BaseModel):
    """Strict JSON models: wrong types are errors, NaN/Infinity are errors, unknown fields are kept."""

    model_config = ConfigDict(strict=True, extra="allow", allow_inf_nan=False, populate_by_name=True)


class StreamOptions(WireModel):
    include_usage: bool | None = None


class GenerationRequest(WireModel):
    """What `/v1/completions` and `/v1/chat/completions` have in common."""

    model_config = ConfigDict(json_schema_extra={"allOf": [STREAM_OPTIONS_NEED_STREAM]})
    model: Annotated[str, Field(min_length=1)]
    frequency_penalty: Penalty | None = None
    presence_penalty: Penalty | None = None
    logit_bias: (
        Annotated[
            dict[TokenId, Annotated[float, Field(ge=-100.0, le=100.0)]],
            Field(json_schema_extra={"additionalProperties": False}),  # every key is a token id
        ]
        | None
    ) = None
    max_tokens: Annotated[int, Field(ge=0)] | None = None
    n: Annotated[int, Field(ge=1)] | None = None
    seed: Annotated[int, Field(ge=INT64_MIN, le=INT64_MAX)] | None = None
    stop: StopSequence | Annotated[list[StopSequence], Field(max_length=MAX_STOP_SEQUENCES)] | None = None
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    temperature: Annotated[float, Field(ge=0.0, le=2.0)] | None = None
    top_p: Annotated[float, Field(ge=0.0, le=1.0)] | None = None
    # Not in the OpenAI API, but llama.cpp's and vLLM's servers take it (and Anthropic's Messages API has it).
    top_k: Annotated[int, Field(ge=1)] | None = None
    user: str | None = None
    # Ollama's: how long the engine keeps the model loaded once idle after this request ("5m", 0, -1: always);
    # passed on to nodes as sent (an Ollama node honours it).
    keep_alive: KeepAlive | None = None

    @field_validator("n")
    @classmethod
    def _n_within_configured_maximum(cls, value: int | None, info: ValidationInfo) -> int | None:
        limit = (info.context or {}).get("max_n")
        if value is not None and limit is not None and value > limit:
            raise ValueError(f"n must be at most {limit} on this server, got {value}")
        return value

    @model_validator(mode="after")
    def _stream_options_need_stream(self) -> GenerationRequest:
        if self.stream_options is not None and not self.stream:
            raise InvalidRequest("stream_options is only allowed when stream is true", param="stream_options")
        return self

    # Derived views used by backends -------------------------------------------------------------
    @property
    def stop_list(self) -> list[str]:
        return [self.stop] if isinstance(self.stop, str) else list(self.stop or [])

    @property
    def choices(self) -> int:
        return self.n or 1

    @property
    def include_usage(self) -> bool:
        return bool(self.stream and self.stream_options and self.stream_options.include_usage)

    @property
    def bias_by_token(self) -> dict[int, float]:
        return {int(k): v for k, v in (self.logit_bias or {}).items()}

    def extra_fields(self) -> list[str]:
        return sorted((self.model_extra or {}).keys())
