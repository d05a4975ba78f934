"""The Messages API request bodies (Anthropic's shapes), validated strictly.

Every field is translated into a chat request. What would change the answer's meaning and cannot be honoured is
refused with a 400 naming it; what is a hint, or has no effect on these models (`thinking` on a model that does
not think, `context_management` edits of thinking it never wrote, `output_config.effort`, server tools the
gateway cannot run, a field this module does not know), is accepted and named by `ignored()`, which the
response's `x-tokenrelay-ignored-fields` header and the request log line carry. `cache_control` is honoured
wherever Anthropic allows it: prompt caching here is automatic (every prompt's prefix is reused from the KV
cache), so what the marker asks for happens without it.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag

from tokenrelay.protocol.common import MAX_STOP_SEQUENCES


class Strict(BaseModel):
    """Strict JSON, no unknown fields, no NaN."""

    model_config = ConfigDict(strict=True, extra="forbid", allow_inf_nan=False)


CacheControl = dict[str, Any] | None


class TextBlock(Strict):
    type: Literal["text"]
    text: str
    cache_control: CacheControl = None
    citations: None = None  # sent back as null by clients that replay a response's blocks


class Base64Source(Strict):
    type: Literal["base64"]
    media_type: str
    data: str


class URLSource(Strict):
    type: Literal["url"]
    url: str


class ImageBlock(Strict):
    type: Literal["image"]
    source: Annotated[Base64Source | URLSource, Field(discriminator="type")]
    cache_control: CacheControl = None


class ToolUseBlock(Strict):
    type: Literal["tool_use"]
    id: Annotated[str, Field(min_length=1)]
    name: Annotated[str, Field(min_length=1)]
    input: dict[str, Any]
    cache_control: CacheControl = None


class ToolResultBlock(Strict):
    type: Literal["tool_result"]
    tool_use_id: Annotated[str, Field(min_length=1)]
    content: str | list[TextBlock] | None = None
    is_error: bool | None = None
    cache_control: CacheControl = None

    def text(self) -> str:
        if self.content is None or isinstance(self.content, str):
            return self.content or ""
        return "".join(block.text for block in self.content)


# What each role's message may hold: a user sends text, images and tool results; an assistant text and tool calls.
# An empty list of blocks is an empty turn (Anthropic's API refuses it; a schema that says "at least one" makes
# generated clients and fuzzers stumble over the tagged blocks, and an empty turn harms nothing).
UserBlock = Annotated[TextBlock | ImageBlock | ToolResultBlock, Field(discriminator="type")]
AssistantBlock = Annotated[TextBlock | ToolUseBlock, Field(discriminator="type")]


class ThinkingBlock(Strict):
    """Thinking a client replays from an earlier answer (of another model): accepted, and not shown to the model."""

    type: Literal["thinking", "redacted_thinking"]
    thinking: str | None = None
    signature: str | None = None
    data: str | None = None
    cache_control: CacheControl = None


AssistantContent = Annotated[TextBlock | ToolUseBlock | ThinkingBlock, Field(discriminator="type")]


Block = UserBlock | AssistantBlock


class UserMessage(Strict):
    role: Literal["user"]
    content: str | list[UserBlock]

    def blocks(self) -> list[UserBlock]:
        return [TextBlock(type="text", text=self.content)] if isinstance(self.content, str) else self.content


class AssistantMessage(Strict):
    role: Literal["assistant"]
    content: str | list[AssistantContent]

    def blocks(self) -> list[AssistantBlock]:
        """The blocks the answer is made of (thinking is the model's own, and these models write none)."""
        if isinstance(self.content, str):
            return [TextBlock(type="text", text=self.content)]
        return [block for block in self.content if isinstance(block, TextBlock | ToolUseBlock)]

    def thinks(self) -> bool:
        return not isinstance(self.content, str) and any(isinstance(b, ThinkingBlock) for b in self.content)


class SystemMessage(Strict):
    """A system message in the conversation (Anthropic's mid-conversation system messages): placed where it is."""

    role: Literal["system"]
    content: str | list[TextBlock]

    def text(self) -> str:
        return self.content if isinstance(self.content, str) else "".join(block.text for block in self.content)


Message = Annotated[UserMessage | AssistantMessage | SystemMessage, Field(discriminator="role")]


class Tool(Strict):
    name: Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_\-]+$")]
    description: str | None = None
    input_schema: dict[str, Any]
    type: Literal["custom"] | None = None
    cache_control: CacheControl = None
    # Hints about how a client wants the call delivered or the tool loaded: the call is the same without them.
    eager_input_streaming: bool | None = None
    defer_loading: bool | None = None
    input_examples: list[dict[str, Any]] | None = None
    strict: bool | None = None

    def hints(self) -> list[str]:
        names = ("eager_input_streaming", "defer_loading", "input_examples", "strict")
        return [name for name in names if getattr(self, name) is not None]


class ServerTool(BaseModel):
    """A tool Anthropic's servers run (web search, code execution, ...): this gateway cannot, so the model is
    not shown it (named in `ignored()`)."""

    model_config = ConfigDict(extra="allow")
    type: str
    name: str | None = None


def _tool_kind(value: Any) -> str:
    kind = value.get("type") if isinstance(value, dict) else getattr(value, "type", None)
    return "server" if isinstance(kind, str) and kind != "custom" else "custom"


AnyTool = Annotated[Annotated[Tool, Tag("custom")] | Annotated[ServerTool, Tag("server")], Discriminator(_tool_kind)]


class ToolChoiceAuto(Strict):
    type: Literal["auto"]
    disable_parallel_tool_use: bool | None = None


class ToolChoiceAny(Strict):
    type: Literal["any"]
    disable_parallel_tool_use: bool | None = None


class ToolChoiceTool(Strict):
    type: Literal["tool"]
    name: str
    disable_parallel_tool_use: bool | None = None


class ToolChoiceNone(Strict):
    type: Literal["none"]


ToolChoice = Annotated[ToolChoiceAuto | ToolChoiceAny | ToolChoiceTool | ToolChoiceNone, Field(discriminator="type")]


class Metadata(Strict):
    user_id: str | None = None


class JSONOutputFormat(Strict):
    type: Literal["json_schema"]
    schema_: dict[str, Any] = Field(alias="schema")


class OutputConfig(Strict):
    """`format` is enforced as chat's `response_format`; `effort` is a hint these models have no use for."""

    model_config = ConfigDict(populate_by_name=True)
    effort: str | None = None
    format: JSONOutputFormat | None = None


# Accepted and named in `ignored()`: hints, or settings of features these models and this gateway do not have.
HINTS = ("thinking", "context_management", "service_tier", "container", "mcp_servers", "inference_geo")


class CountTokensRequest(BaseModel):
    """`POST /v1/messages/count_tokens`: the prompt of a Messages request, without the sampling fields."""

    # Unknown fields are kept (as hints, named in `ignored()`), never silently dropped and never a 400.
    model_config = ConfigDict(strict=True, extra="allow", allow_inf_nan=False)

    model: Annotated[str, Field(min_length=1)]
    messages: Annotated[list[Message], Field(min_length=1)]
    system: str | list[TextBlock] | None = None
    tools: list[AnyTool] | None = None
    tool_choice: ToolChoice | None = None
    thinking: dict[str, Any] | None = None
    context_management: dict[str, Any] | None = None
    output_config: OutputConfig | None = None
    service_tier: str | None = None
    container: Any = None
    mcp_servers: list[dict[str, Any]] | None = None
    inference_geo: str | None = None
    cache_control: CacheControl = None

    def function_tools(self) -> list[Tool]:
        return [tool for tool in self.tools or [] if isinstance(tool, Tool)]

    def ignored(self) -> list[str]:
        """The fields sent that are accepted without effect, as paths into the body."""
        names = [name for name in HINTS if getattr(self, name) is not None]
        names += list(self.model_extra or {})
        if self.output_config is not None and self.output_config.effort is not None:
            names.append("output_config.effort")
        for i, tool in enumerate(self.tools or []):
            hints = [f"tools.{i}.{hint}" for hint in tool.hints()] if isinstance(tool, Tool) else [f"tools.{i}"]
            names += hints
        names += [
            f"messages.{i}.thinking"
            for i, m in enumerate(self.messages)
            if isinstance(m, AssistantMessage) and m.thinks()
        ]
        return names


class MessagesRequest(CountTokensRequest):
    """`POST /v1/messages`."""

    max_tokens: Annotated[int, Field(ge=1)]
    stop_sequences: (
        Annotated[list[Annotated[str, Field(min_length=1)]], Field(max_length=MAX_STOP_SEQUENCES)] | None
    ) = None
    temperature: Annotated[float, Field(ge=0.0, le=1.0)] | None = None
    top_p: Annotated[float, Field(ge=0.0, le=1.0)] | None = None
    top_k: Annotated[int, Field(ge=1)] | None = None
    metadata: Metadata | None = None
    stream: bool | None = None
