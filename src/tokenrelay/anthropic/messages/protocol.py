"""The Messages API request bodies (Anthropic's shapes), validated strictly: unknown fields are refused.

Unlike the OpenAI models (which keep unknown fields and forward them to nodes), every field here is translated
into a chat request, so a field this module does not know would be silently dropped: it is a 400 instead.
`cache_control` is accepted wherever Anthropic allows it: prompt caching here is automatic (every prompt's
prefix is reused from the KV cache), so what the marker asks for happens without it.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, WithJsonSchema

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
Block = UserBlock | AssistantBlock


class UserMessage(Strict):
    role: Literal["user"]
    content: str | list[UserBlock]

    def blocks(self) -> list[UserBlock]:
        return [TextBlock(type="text", text=self.content)] if isinstance(self.content, str) else self.content


class AssistantMessage(Strict):
    role: Literal["assistant"]
    content: str | list[AssistantBlock]

    def blocks(self) -> list[AssistantBlock]:
        return [TextBlock(type="text", text=self.content)] if isinstance(self.content, str) else self.content


Message = Annotated[UserMessage | AssistantMessage, Field(discriminator="role")]


class Tool(Strict):
    name: Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_\-]+$")]
    description: str | None = None
    input_schema: dict[str, Any]
    type: Literal["custom"] | None = None
    cache_control: CacheControl = None


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


class CountTokensRequest(Strict):
    """`POST /v1/messages/count_tokens`: the prompt of a Messages request, without the sampling fields."""

    model: Annotated[str, Field(min_length=1)]
    messages: Annotated[list[Message], Field(min_length=1)]
    system: str | list[TextBlock] | None = None
    tools: list[Tool] | None = None
    tool_choice: ToolChoice | None = None
    # Refused when set, with a message that says why (see `translate`): no model here thinks.
    thinking: Annotated[dict[str, Any] | None, WithJsonSchema({"type": "null"})] = None
    cache_control: CacheControl = None


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
