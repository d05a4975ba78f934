"""`POST /v1/responses` request body: strict wire models, as the chat models are.

Input items and their parts refuse fields they do not know (a 400 naming the field); the body itself
refuses every field outside the ones served here, with a message that tells a parameter this server does
not support from one that does not exist.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag, WithJsonSchema, field_validator, model_validator

from tokenrelay.errors import UNSUPPORTED_PARAMETER, InvalidRequest
from tokenrelay.protocol.common import WireModel

# Parameters of OpenAI's Responses API that this server does not serve; sent with a value, each is a 400.
UNSUPPORTED = (
    "background",
    "conversation",
    "include",
    "max_tool_calls",
    "prompt",
    "prompt_cache_key",
    "safety_identifier",
    "service_tier",
    "stream_options",
    "top_logprobs",
)
BUILT_IN_TOOLS = (
    "web_search, web_search_preview, file_search, code_interpreter, computer_use_preview, image_generation, mcp, "
    "local_shell, custom"
)


class ItemModel(BaseModel):
    """Strict, and unknown fields are errors (pydantic names them in `param`)."""

    model_config = ConfigDict(strict=True, extra="forbid", allow_inf_nan=False, populate_by_name=True)


class InputText(ItemModel):
    type: Literal["input_text"]
    text: str


class OutputText(ItemModel):
    type: Literal["output_text"]
    text: str
    annotations: list[dict[str, Any]] | None = None
    logprobs: list[dict[str, Any]] | None = None


class InputImage(ItemModel):
    type: Literal["input_image"]
    image_url: str | None = None
    file_id: str | None = None
    detail: Literal["low", "high", "auto"] | None = None


class InputFile(ItemModel):
    type: Literal["input_file"]
    file_id: str | None = None
    file_data: str | None = None
    file_url: str | None = None
    filename: str | None = None


class Refusal(ItemModel):
    type: Literal["refusal"]
    refusal: str


ContentPart = Annotated[InputText | OutputText | InputImage | InputFile | Refusal, Field(discriminator="type")]


class MessageItem(ItemModel):
    """A message; `type` may be left out, as the API allows for `{"role", "content"}` items."""

    type: Literal["message"] = "message"
    role: Literal["user", "assistant", "system", "developer"]
    content: str | list[ContentPart]
    id: str | None = None
    status: Literal["in_progress", "completed", "incomplete"] | None = None


class FunctionCallItem(ItemModel):
    """A call the model made, sent back so the conversation shows it."""

    type: Literal["function_call"]
    call_id: Annotated[str, Field(min_length=1)]
    name: str
    arguments: str
    id: str | None = None
    status: Literal["in_progress", "completed", "incomplete"] | None = None


class FunctionCallOutputItem(ItemModel):
    """The result of a function call, answering its `call_id`."""

    type: Literal["function_call_output"]
    call_id: Annotated[str, Field(min_length=1)]
    output: str | list[ContentPart]
    id: str | None = None
    status: Literal["in_progress", "completed", "incomplete"] | None = None


def _item_type(value: Any) -> str:
    kind = value.get("type", "message") if isinstance(value, dict) else getattr(value, "type", "message")
    return kind if isinstance(kind, str) else "message"


InputItem = Annotated[
    Annotated[MessageItem, Tag("message")]
    | Annotated[FunctionCallItem, Tag("function_call")]
    | Annotated[FunctionCallOutputItem, Tag("function_call_output")],
    Discriminator(_item_type),
]


class FunctionTool(ItemModel):
    """A function tool, flat as the Responses API has it (no nested `function` object)."""

    type: Literal["function"]
    name: Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_\-]+$")]
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class FunctionChoice(ItemModel):
    type: Literal["function"]
    name: str


class TextFormatText(ItemModel):
    type: Literal["text"]


class TextFormatJsonObject(ItemModel):
    type: Literal["json_object"]


class TextFormatJsonSchema(ItemModel):
    type: Literal["json_schema"]
    name: Annotated[str, Field(min_length=1, max_length=64)]
    schema_: dict[str, Any] = Field(alias="schema")
    description: str | None = None
    strict: bool | None = None


TextFormat = Annotated[TextFormatText | TextFormatJsonObject | TextFormatJsonSchema, Field(discriminator="type")]


class TextConfig(ItemModel):
    format: TextFormat | None = None


def _document_unserved(schema: dict[str, Any]) -> None:
    """In the published schema: no unknown fields, and the unserved parameters only without a value."""
    schema["additionalProperties"] = False
    unset = {"anyOf": [{"type": "null"}, {"const": False}, {"type": "array", "maxItems": 0}]}
    schema["properties"].update({name: {**unset, "description": "not served here"} for name in UNSUPPORTED})


class ResponsesRequest(WireModel):
    """The body of `POST /v1/responses` (the parameters this server serves)."""

    model_config = ConfigDict(json_schema_extra=_document_unserved)

    model: Annotated[str, Field(min_length=1)]
    input: str | Annotated[list[InputItem], Field(min_length=1)]
    instructions: str | None = None
    max_output_tokens: Annotated[int, Field(ge=1)] | None = None
    temperature: Annotated[float, Field(ge=0.0, le=2.0)] | None = None
    top_p: Annotated[float, Field(ge=0.0, le=1.0)] | None = None
    tools: list[FunctionTool] | None = None
    tool_choice: Literal["none", "auto", "required"] | FunctionChoice | None = None
    parallel_tool_calls: bool | None = None
    text: TextConfig | None = None
    metadata: Annotated[dict[str, Annotated[str, Field(max_length=512)]], Field(max_length=16)] | None = None
    user: str | None = None
    truncation: Literal["auto", "disabled"] | None = None
    store: bool | None = None
    stream: bool | None = None
    previous_response_id: str | None = None
    # Refused when set (no model here has reasoning controls), with a message that says so.
    reasoning: Annotated[dict[str, Any] | None, WithJsonSchema({"type": "null"})] = None

    @field_validator("tools", mode="before")
    @classmethod
    def _function_tools_only(cls, value: Any) -> Any:
        for i, tool in enumerate(value if isinstance(value, list) else []):
            kind = tool.get("type") if isinstance(tool, dict) else None
            if kind is not None and kind != "function":
                raise InvalidRequest(
                    f"The built-in tool type {kind!r} is not supported by this server; only `function` tools are "
                    f"(built-in tools: {BUILT_IN_TOOLS}).",
                    param=f"tools.{i}.type",
                    code=UNSUPPORTED_PARAMETER,
                )
        return value

    @field_validator("tool_choice", mode="before")
    @classmethod
    def _function_choice_only(cls, value: Any) -> Any:
        kind = value.get("type") if isinstance(value, dict) else None
        if kind is not None and kind != "function":
            raise InvalidRequest(
                f"tool_choice of type {kind!r} is not supported by this server: use `none`, `auto`, `required` "
                'or {"type": "function", "name": ...}.',
                param="tool_choice",
                code=UNSUPPORTED_PARAMETER,
            )
        return value

    @field_validator("metadata")
    @classmethod
    def _short_keys(cls, value: dict[str, str] | None) -> dict[str, str] | None:
        for key in value or {}:
            if len(key) > 64:
                raise ValueError(f"metadata keys may be at most 64 characters, got {len(key)}")
        return value

    @model_validator(mode="after")
    def _nothing_unserved(self) -> ResponsesRequest:
        extra = self.model_extra or {}
        unknown = [name for name in extra if name not in UNSUPPORTED]
        if unknown:
            raise InvalidRequest(f"Unrecognized request argument supplied: {', '.join(unknown)}", param=unknown[0])
        for name, value in extra.items():
            if not (value is None or value is False or value == []):  # `0` is a value (and equals False)
                raise InvalidRequest(
                    f"`{name}` is not supported by this server.", param=name, code=UNSUPPORTED_PARAMETER
                )
        if self.reasoning is not None:
            raise InvalidRequest(
                f"`reasoning` is not supported with the model `{self.model}`: it has no reasoning controls.",
                param="reasoning",
                code=UNSUPPORTED_PARAMETER,
            )
        return self

    @model_validator(mode="after")
    def _tool_choice_names_a_tool(self) -> ResponsesRequest:
        names = [tool.name for tool in self.tools or []]
        if self.tool_choice == "required" and not names:
            raise InvalidRequest("`tool_choice: required` needs `tools`.", param="tool_choice")
        if isinstance(self.tool_choice, FunctionChoice) and self.tool_choice.name not in names:
            raise InvalidRequest(
                f"`tool_choice` names the function `{self.tool_choice.name}`, which is not among the `tools`.",
                param="tool_choice",
            )
        return self
