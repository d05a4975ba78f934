"""`POST /v1/responses` request body: strict wire models, as the chat models are.

Input items and their parts refuse fields they do not know (a 400 naming the field). The body refuses, with a
400 naming it, a parameter that would change what the answer means and cannot be honoured here (`REFUSED`);
it accepts what is a hint, or has no effect on these models (`HINTS`, a hosted tool the gateway cannot run, a
field it does not know), and names each in `ignored()`, which the response's `x-tokenrelay-ignored-fields`
header and the request log line carry.
"""

from __future__ import annotations

from functools import cached_property
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag, field_validator, model_validator

from tokenrelay.errors import UNSUPPORTED_PARAMETER, InvalidRequest
from tokenrelay.protocol.common import WireModel

# Parameters of OpenAI's Responses API that change the answer and are not served here: sent with a value, a 400.
REFUSED = ("background", "conversation", "max_tool_calls", "prompt", "top_logprobs")
# Accepted without effect: cache and routing hints (prefix caching here is automatic), client and safety metadata,
# items to include that these answers never have (no reasoning, no hosted tools), reasoning settings of models
# that do not reason, and the stream's options.
HINTS = (
    "client_metadata",
    "include",
    "prompt_cache_key",
    "prompt_cache_retention",
    "reasoning",
    "safety_identifier",
    "service_tier",
    "stream_options",
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


class CallItem(ItemModel):
    """What every tool call item and its answer carry: the call's id, and the item's own id and status."""

    call_id: Annotated[str, Field(min_length=1)]
    id: str | None = None
    status: Literal["in_progress", "completed", "incomplete"] | None = None


class FunctionCallItem(CallItem):
    """A call the model made, sent back so the conversation shows it."""

    type: Literal["function_call"]
    name: str
    arguments: str
    namespace: str | None = None  # the namespace tool the function belongs to


class FunctionCallOutputItem(CallItem):
    """The result of a function call, answering its `call_id`."""

    type: Literal["function_call_output"]
    output: str | list[ContentPart]


class CustomToolCallItem(CallItem):
    """A call of a custom tool the model made, with its free-text input, sent back so the conversation shows it."""

    type: Literal["custom_tool_call"]
    name: str
    input: str


class CustomToolCallOutputItem(CallItem):
    """The result of a custom tool call, answering its `call_id`."""

    type: Literal["custom_tool_call_output"]
    output: str | list[ContentPart]


class ReasoningItem(ItemModel):
    """Reasoning an earlier answer gave, sent back with the conversation (as Codex does): kept in the stored
    input, not shown to the model again."""

    type: Literal["reasoning"]
    id: str | None = None
    summary: list[dict[str, Any]] = Field(default_factory=list)
    content: list[dict[str, Any]] | None = None
    encrypted_content: str | None = None
    status: Literal["in_progress", "completed", "incomplete"] | None = None


def _item_type(value: Any) -> str:
    kind = value.get("type", "message") if isinstance(value, dict) else getattr(value, "type", "message")
    return kind if isinstance(kind, str) else "message"


InputItem = Annotated[
    Annotated[MessageItem, Tag("message")]
    | Annotated[FunctionCallItem, Tag("function_call")]
    | Annotated[FunctionCallOutputItem, Tag("function_call_output")]
    | Annotated[CustomToolCallItem, Tag("custom_tool_call")]
    | Annotated[CustomToolCallOutputItem, Tag("custom_tool_call_output")]
    | Annotated[ReasoningItem, Tag("reasoning")],
    Discriminator(_item_type),
]


class FunctionTool(ItemModel):
    """A function tool, flat as the Responses API has it (no nested `function` object)."""

    type: Literal["function"]
    name: Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_\-]+$")]
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class NamespaceTool(ItemModel):
    """Functions grouped under a name (Codex's sub-agent tools): the model is shown the functions, and a call of
    one names its namespace, as OpenAI's answers do."""

    type: Literal["namespace"]
    name: Annotated[str, Field(min_length=1)]
    description: str | None = None
    tools: list[FunctionTool]


class CustomTool(ItemModel):
    """A tool that takes free text instead of JSON arguments (OpenAI's `custom` tools, such as a patch tool). Every
    backend is shown it as a function of one string, `input`; a call's input comes back as the text. A `regex`
    format becomes the string's `pattern` (the engine's decoder enforces it); a `lark` grammar is shown to the model
    in the description, and the engine has the call's text follow it (`FunctionDef.lark`)."""

    type: Literal["custom"]
    name: Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_\-]+$")]
    description: str | None = None
    format: dict[str, Any] | None = None  # {"type": "text"} or {"type": "grammar", "syntax", "definition"}

    @property
    def grammar(self) -> tuple[str, str] | None:
        """The format's syntax and definition, for a grammar format."""
        fmt = self.format or {}
        definition = fmt.get("definition")
        if fmt.get("type") != "grammar" or not isinstance(definition, str):
            return None
        return str(fmt.get("syntax", "lark")), definition

    @property
    def described_grammar(self) -> bool:
        """The format is a grammar shown to the model rather than made a JSON Schema pattern."""
        return self.grammar is not None and self.grammar[0] != "regex"

    @property
    def lark(self) -> str | None:
        """The format's Lark grammar, if it is one."""
        return self.grammar[1] if self.grammar is not None and self.grammar[0] == "lark" else None

    def as_function(self) -> FunctionTool:
        described = self.description or ""
        text: dict[str, Any] = {"type": "string", "description": "The tool's input, as free text."}
        if self.grammar is not None and not self.described_grammar:
            text["pattern"] = f"^(?:{self.grammar[1]})$"  # the whole input (a JSON Schema pattern may match a part)
        elif self.grammar is not None:
            described += f"\nThe input follows this {self.grammar[0]} grammar:\n{self.grammar[1]}"
        parameters = {"type": "object", "properties": {"input": text}, "required": ["input"]}
        return FunctionTool(type="function", name=self.name, description=described or None, parameters=parameters)


class HostedTool(BaseModel):
    """A tool OpenAI's servers run (web search, file search, code interpreter, ...): this gateway cannot, so the
    model is not shown it."""

    model_config = ConfigDict(extra="allow")
    type: str


def _tool_type(value: Any) -> str:
    kind = value.get("type") if isinstance(value, dict) else getattr(value, "type", None)
    return kind if kind in ("function", "namespace", "custom") else "hosted"


Tool = Annotated[
    Annotated[FunctionTool, Tag("function")]
    | Annotated[NamespaceTool, Tag("namespace")]
    | Annotated[CustomTool, Tag("custom")]
    | Annotated[HostedTool, Tag("hosted")],
    Discriminator(_tool_type),
]


class FunctionChoice(ItemModel):
    type: Literal["function", "custom"]
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
    verbosity: str | None = None  # a hint these models have no use for


def _document_unserved(schema: dict[str, Any]) -> None:
    """In the published schema: the refused parameters only without a value; the hints as what they are."""
    unset = {"anyOf": [{"type": "null"}, {"const": False}, {"type": "array", "maxItems": 0}]}
    schema["properties"].update({name: {**unset, "description": "not served here"} for name in REFUSED})
    hint = {"description": "accepted without effect (named in the x-tokenrelay-ignored-fields header)"}
    schema["properties"].update({name: hint for name in HINTS})


class ResponsesRequest(WireModel):
    """The body of `POST /v1/responses` (the parameters this server serves)."""

    model_config = ConfigDict(json_schema_extra=_document_unserved)

    model: Annotated[str, Field(min_length=1)]
    input: str | Annotated[list[InputItem], Field(min_length=1)]
    instructions: str | None = None
    max_output_tokens: Annotated[int, Field(ge=1)] | None = None
    temperature: Annotated[float, Field(ge=0.0, le=2.0)] | None = None
    top_p: Annotated[float, Field(ge=0.0, le=1.0)] | None = None
    tools: list[Tool] | None = None
    tool_choice: Literal["none", "auto", "required"] | FunctionChoice | None = None
    parallel_tool_calls: bool | None = None
    text: TextConfig | None = None
    metadata: Annotated[dict[str, Annotated[str, Field(max_length=512)]], Field(max_length=16)] | None = None
    user: str | None = None
    truncation: Literal["auto", "disabled"] | None = None
    store: bool | None = None
    stream: bool | None = None
    previous_response_id: str | None = None

    @cached_property  # asked for every call the model makes and every call sent back: built once
    def functions(self) -> dict[str, tuple[FunctionTool, str | None]]:
        """The functions the model is shown, by the name it calls them with, each with its namespace: a
        namespace's function keeps its own name unless another tool has it (then `namespace__name`)."""
        plain = {tool.name for tool in self.tools or [] if isinstance(tool, FunctionTool | CustomTool)}
        shown: dict[str, tuple[FunctionTool, str | None]] = {}
        for tool in self.tools or []:
            if isinstance(tool, FunctionTool):
                shown[tool.name] = (tool, None)
            elif isinstance(tool, CustomTool):
                shown[tool.name] = (tool.as_function(), None)
            elif isinstance(tool, NamespaceTool):
                for inner in tool.tools:
                    name = inner.name if inner.name not in plain else f"{tool.name}__{inner.name}"
                    shown[name] = (inner, tool.name)
        return shown

    @cached_property
    def lark_grammars(self) -> dict[str, str]:
        """The Lark grammars of custom tools, by tool name."""
        return {tool.name: tool.lark for tool in self.tools or [] if isinstance(tool, CustomTool) and tool.lark}

    @cached_property
    def custom(self) -> set[str]:
        """The names of the custom tools: their calls are `custom_tool_call` items with a text input."""
        return {tool.name for tool in self.tools or [] if isinstance(tool, CustomTool)}

    def called(self, shown: str) -> tuple[str, str | None]:
        """A called function's own name and namespace, from the name the model called it by."""
        tool, namespace = self.functions.get(shown, (None, None))
        return (tool.name if tool is not None else shown), namespace

    def shown_name(self, name: str, namespace: str | None) -> str:
        """The name the model knows a (namespaced) function by, for a call sent back in the input."""
        if namespace is None:
            return name
        found = [shown for shown, (tool, space) in self.functions.items() if (tool.name, space) == (name, namespace)]
        return found[0] if found else name

    def ignored(self, follows_lark: bool = False) -> list[str]:
        """The fields sent that are accepted without effect, as paths into the body; a Lark format has effect
        only where the backend `follows_lark` (the engine)."""
        served = (*REFUSED, "prompt_cache_key")  # the cache key keeps a conversation on one node (`chat_request`)
        names = [name for name in (self.model_extra or {}) if name not in served]
        names += [f"tools.{i}" for i, tool in enumerate(self.tools or []) if isinstance(tool, HostedTool)]
        described = [
            isinstance(tool, CustomTool) and tool.described_grammar and not (follows_lark and tool.lark)
            for tool in self.tools or []
        ]
        names += [f"tools.{i}.format" for i, shown in enumerate(described) if shown]
        if self.text is not None and self.text.verbosity is not None:
            names.append("text.verbosity")
        return names

    @field_validator("tool_choice", mode="before")
    @classmethod
    def _function_choice_only(cls, value: Any) -> Any:
        kind = value.get("type") if isinstance(value, dict) else None
        if kind is not None and kind not in ("function", "custom"):
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
    def _nothing_refused(self) -> ResponsesRequest:
        for name, value in (self.model_extra or {}).items():
            if name in REFUSED and not (value is None or value is False or value == []):  # `0` is a value
                raise InvalidRequest(
                    f"`{name}` is not supported by this server.", param=name, code=UNSUPPORTED_PARAMETER
                )
        return self

    @model_validator(mode="after")
    def _tool_choice_names_a_tool(self) -> ResponsesRequest:
        names = list(self.functions)
        if self.tool_choice == "required" and not names:
            raise InvalidRequest("`tool_choice: required` needs `tools`.", param="tool_choice")
        if isinstance(self.tool_choice, FunctionChoice) and self.tool_choice.name not in names:
            raise InvalidRequest(
                f"`tool_choice` names the function `{self.tool_choice.name}`, which is not among the `tools`.",
                param="tool_choice",
            )
        return self
