"""`POST /v1/chat/completions` request body: messages of every role, tools and response formats."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import ConfigDict, Field, PrivateAttr, model_validator

from tokenrelay.errors import InvalidRequest
from tokenrelay.protocol.common import STREAM_OPTIONS_NEED_STREAM, GenerationRequest, WireModel, requires


class TextPart(WireModel):
    type: Literal["text"]
    text: str


class ImageURL(WireModel):
    url: str
    detail: str | None = None


class ImagePart(WireModel):
    type: Literal["image_url"]
    image_url: ImageURL


class AudioPart(WireModel):
    type: Literal["input_audio"]
    input_audio: dict[str, Any]


class RefusalPart(WireModel):
    type: Literal["refusal"]
    refusal: str


ContentPart = Annotated[TextPart | ImagePart | AudioPart | RefusalPart, Field(discriminator="type")]
Content = str | list[ContentPart]


def _part_text(part: ContentPart) -> str:
    if isinstance(part, TextPart):
        return part.text
    return part.refusal if isinstance(part, RefusalPart) else ""


class FunctionCall(WireModel):
    name: str
    arguments: str


class ToolCall(WireModel):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class _Message(WireModel):
    content: Content | None = None
    name: str | None = None

    def text(self) -> str:
        """Content as plain text (image/audio parts are rejected before this is called)."""
        if self.content is None or isinstance(self.content, str):
            return self.content or ""
        return "".join(_part_text(part) for part in self.content)

    def media_parts(self) -> list[str]:
        if not isinstance(self.content, list):
            return []
        return [part.type for part in self.content if part.type in ("image_url", "input_audio")]


class SystemMessage(_Message):
    role: Literal["system"]
    content: Content


class DeveloperMessage(_Message):
    """OpenAI's newer name for system instructions; rendered as a system turn."""

    role: Literal["developer"]
    content: Content


class UserMessage(_Message):
    role: Literal["user"]
    content: Content


class AssistantMessage(_Message):
    role: Literal["assistant"]
    refusal: str | None = None
    tool_calls: list[ToolCall] | None = None
    function_call: FunctionCall | None = None


class ToolMessage(_Message):
    role: Literal["tool"]
    content: Content
    tool_call_id: Annotated[str, Field(min_length=1)]


class FunctionMessage(_Message):
    """Legacy answer to a `function_call`."""

    role: Literal["function"]
    name: str
    content: Content | None = None


Message = Annotated[
    SystemMessage | DeveloperMessage | UserMessage | AssistantMessage | ToolMessage | FunctionMessage,
    Field(discriminator="role"),
]


class FunctionDef(WireModel):
    name: Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_\-]+$")]
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None
    # A Responses custom tool's Lark grammar: the engine has the call's text follow it. Set by the Responses
    # translation only, so it is never read from nor written to the wire (a node is shown the grammar instead).
    _lark: str | None = PrivateAttr(default=None)

    @property
    def lark(self) -> str | None:
        return self._lark

    def follow_lark(self, grammar: str) -> None:
        self._lark = grammar


class Tool(WireModel):
    type: Literal["function"]
    function: FunctionDef


class NamedFunction(WireModel):
    name: str


class NamedToolChoice(WireModel):
    type: Literal["function"]
    function: NamedFunction


class JsonSchemaFormat(WireModel):
    name: Annotated[str, Field(min_length=1, max_length=64)]
    description: str | None = None
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")
    strict: bool | None = None


class ResponseFormat(WireModel):
    model_config = ConfigDict(
        json_schema_extra={
            "if": {"properties": {"type": {"const": "json_schema"}}},
            "then": {"required": ["json_schema"], "properties": {"json_schema": {"type": "object"}}},
        }
    )
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None

    @model_validator(mode="after")
    def _schema_present(self) -> ResponseFormat:
        if self.type == "json_schema" and self.json_schema is None:
            raise InvalidRequest(
                "response_format of type json_schema needs a json_schema object", param="response_format"
            )
        return self


def needs_list(choice: str, listed: str) -> dict[str, Any]:
    """A JSON Schema rule: `required` or a named function as `choice` needs the `listed` functions."""
    return {
        "if": {
            "required": [choice],
            "properties": {choice: {"anyOf": [{"const": "required"}, {"type": "object"}]}},
        },
        "then": {"required": [listed], "properties": {listed: {"type": "array"}}},
    }


class ChatCompletionRequest(GenerationRequest):
    # What JSON Schema can say of the rules between fields; a named tool choice must also name one of the
    # `tools`, and a `tool` message answer a call an earlier assistant message made.
    model_config = ConfigDict(
        json_schema_extra={
            "allOf": [
                STREAM_OPTIONS_NEED_STREAM,
                requires("top_logprobs", "logprobs"),
                needs_list("tool_choice", "tools"),
                needs_list("function_call", "functions"),
            ]
        }
    )

    messages: Annotated[list[Message], Field(min_length=1)]
    max_tokens: Annotated[int, Field(ge=1)] | None = None
    max_completion_tokens: Annotated[int, Field(ge=1)] | None = None
    logprobs: bool | None = None
    top_logprobs: Annotated[int, Field(ge=0, le=20)] | None = None
    response_format: ResponseFormat | None = None
    tools: Annotated[list[Tool], Field(min_length=1)] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool | None = None
    functions: Annotated[list[FunctionDef], Field(min_length=1)] | None = None
    function_call: Literal["none", "auto"] | NamedFunction | None = None
    service_tier: str | None = None
    continue_final_message: bool = Field(
        default=False,
        description="vLLM's extension: the model writes on from the last message, an assistant's, in place of a "
        "new turn (the answer holds only the new text)",
    )

    @model_validator(mode="after")
    def _continues_an_assistant(self) -> ChatCompletionRequest:
        last = self.messages[-1]
        plain = isinstance(last, AssistantMessage) and not (last.tool_calls or last.function_call)
        if self.continue_final_message and not plain:
            raise InvalidRequest(
                "continue_final_message needs the last message to be an assistant's, with text and no tool calls.",
                param="continue_final_message",
            )
        return self

    @model_validator(mode="after")
    def _top_logprobs_need_logprobs(self) -> ChatCompletionRequest:
        if self.top_logprobs is not None and not self.logprobs:
            raise InvalidRequest("top_logprobs requires logprobs to be true", param="top_logprobs")
        return self

    @model_validator(mode="after")
    def _tool_choice_names_a_given_tool(self) -> ChatCompletionRequest:
        tools = [tool.function.name for tool in self.tools or []]
        _check_choice(self.tool_choice, tools, "tool_choice", "tools")
        _check_choice(self.function_call, [f.name for f in self.functions or []], "function_call", "functions")
        return self

    @model_validator(mode="after")
    def _tool_messages_answer_calls(self) -> ChatCompletionRequest:
        """A `tool` message answers a call an earlier assistant message made, by its id (as OpenAI checks)."""
        made: set[str] = set()
        for i, message in enumerate(self.messages):
            if isinstance(message, AssistantMessage):
                made.update(call.id for call in message.tool_calls or [])
            elif isinstance(message, ToolMessage):
                _check_answer(message, i, made)
        return self

    @property
    def token_limit(self) -> int | None:
        """`max_completion_tokens` is the newer name; it wins when both are sent."""
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens


def _check_choice(choice: object, names: list[str], param: str, listed: str) -> None:
    """A required or named choice needs the tools it chooses from (`none`/`auto` without tools are harmless)."""
    if choice == "required" and not names:
        raise InvalidRequest(f"`{param}: required` needs `{listed}`.", param=param)
    name = choice.function.name if isinstance(choice, NamedToolChoice) else getattr(choice, "name", None)
    if name is None:
        return
    if not names:
        raise InvalidRequest(f"`{param}` names the function `{name}` but no `{listed}` were given.", param=param)
    if name not in names:
        raise InvalidRequest(f"`{param}` names `{name}`, which is not among the `{listed}`.", param=param)


def _check_answer(message: ToolMessage, index: int, made: set[str]) -> None:
    if message.tool_call_id not in made:
        raise InvalidRequest(
            f"Invalid parameter: messages[{index}] has role 'tool' but answers tool_call_id "
            f"{message.tool_call_id!r}, which no earlier assistant message's 'tool_calls' made.",
            param=f"messages.{index}.tool_call_id",
        )
