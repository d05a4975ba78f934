"""A Messages request → the `ChatCompletionRequest` every backend serves.

Blocks become chat messages: text and images a user turn's parts, `tool_use` an assistant turn's `tool_calls`
(arguments as JSON text), each `tool_result` a `tool` message (in the block's place, so the order the model
reads is the order sent), and a system message inside `messages` a chat system message where it stands. Tools
become chat function tools, so the engine's structured tool-call path (and a node's own) constrains their
arguments exactly as for chat; `output_config.format` becomes chat's `response_format`, enforced the same way.
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import ValidationError

from tokenrelay.anthropic.messages.errors import invalid_body
from tokenrelay.anthropic.messages.protocol import (
    AssistantBlock,
    AssistantMessage,
    CountTokensRequest,
    ImageBlock,
    Message,
    MessagesRequest,
    SystemMessage,
    TextBlock,
    ToolChoiceAny,
    ToolChoiceNone,
    ToolChoiceTool,
    UserBlock,
)
from tokenrelay.errors import InvalidRequest
from tokenrelay.protocol.chat import ChatCompletionRequest

# What a failed tool's result is marked with, since chat's `tool` message has no error flag.
ERROR_MARK = "Error: "


def to_chat(request: CountTokensRequest, *, stream: bool = False) -> ChatCompletionRequest:
    """The chat request the Messages request stands for (a count_tokens body has no sampling fields)."""
    _check_supported(request)
    body: dict[str, Any] = {"model": request.model, "messages": _system(request.system) + _messages(request.messages)}
    if request.messages[-1].role == "assistant":
        body["continue_final_message"] = True  # a prefill: the answer writes on from it
    tools = request.function_tools()
    if tools:
        body["tools"] = [_tool(tool) for tool in tools]
    if request.tool_choice is not None:
        body |= _tool_choice(request.tool_choice, bool(tools))
    output = request.output_config
    if output is not None and output.format is not None:
        schema = {"name": "output", "schema": output.format.schema_, "strict": True}
        body["response_format"] = {"type": "json_schema", "json_schema": schema}
    if isinstance(request, MessagesRequest):
        body |= _sampling(request, stream)
    try:
        return ChatCompletionRequest.model_validate(body)
    except ValidationError as exc:
        raise invalid_body(exc) from None


def _check_supported(request: CountTokensRequest) -> None:
    last = request.messages[-1]
    if isinstance(last, AssistantMessage) and any(block.type == "tool_use" for block in last.blocks()):
        raise InvalidRequest(
            "A final assistant message (a prefill the answer continues) may hold text only, not `tool_use` blocks.",
            param=f"messages.{len(request.messages) - 1}.content",
        )


def _sampling(request: MessagesRequest, stream: bool) -> dict[str, Any]:
    fields: dict[str, Any] = {"max_tokens": request.max_tokens, "stream": stream}
    if request.stop_sequences:
        fields["stop"] = list(request.stop_sequences)
    for name in ("temperature", "top_p", "top_k"):
        value = getattr(request, name)
        if value is not None:
            fields[name] = value
    if request.metadata is not None and request.metadata.user_id is not None:
        fields["user"] = request.metadata.user_id
    return fields


def _system(system: str | list[TextBlock] | None) -> list[dict[str, Any]]:
    if system is None:
        return []
    text = system if isinstance(system, str) else "".join(block.text for block in system)
    return [{"role": "system", "content": text}]


def _messages(messages: list[Message]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for message in messages:
        if isinstance(message, AssistantMessage):
            out.append(_assistant(message.blocks()))
        elif isinstance(message, SystemMessage):
            out.append({"role": "system", "content": message.text()})
        else:
            out.extend(_user(message.blocks()))
    return out


def _assistant(blocks: list[AssistantBlock]) -> dict[str, Any]:
    text: list[str] = []
    calls: list[dict[str, Any]] = []
    for block in blocks:
        if isinstance(block, TextBlock):
            text.append(block.text)
        else:
            arguments = json.dumps(block.input, ensure_ascii=False)
            calls.append({"id": block.id, "type": "function", "function": {"name": block.name, "arguments": arguments}})
    message: dict[str, Any] = {"role": "assistant", "content": "".join(text) or None}
    if calls:
        message["tool_calls"] = calls
    return message


def _user(blocks: list[UserBlock]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    parts: list[dict[str, Any]] = []
    for block in blocks:
        if isinstance(block, TextBlock):
            parts.append({"type": "text", "text": block.text})
        elif isinstance(block, ImageBlock):
            parts.append({"type": "image_url", "image_url": {"url": _image_url(block)}})
        else:
            if parts:
                out.append(_user_turn(parts))
                parts = []
            text = (ERROR_MARK if block.is_error else "") + block.text()
            out.append({"role": "tool", "tool_call_id": block.tool_use_id, "content": text})
    if parts or not out:  # an empty list of blocks is an empty turn
        out.append(_user_turn(parts))
    return out


def _user_turn(parts: list[dict[str, Any]]) -> dict[str, Any]:
    """Text alone as one string: many chat templates (and nodes) read `content` only as a string."""
    if all(part["type"] == "text" for part in parts):
        return {"role": "user", "content": "".join(part["text"] for part in parts)}
    return {"role": "user", "content": parts}


def _image_url(block: ImageBlock) -> str:
    source = block.source
    if source.type == "url":
        return source.url
    return f"data:{source.media_type};base64,{source.data}"


def _tool(tool: Any) -> dict[str, Any]:
    function: dict[str, Any] = {"name": tool.name, "parameters": tool.input_schema}
    if tool.description is not None:
        function["description"] = tool.description
    return {"type": "function", "function": function}


def _tool_choice(choice: Any, has_tools: bool) -> dict[str, Any]:
    if isinstance(choice, ToolChoiceNone):
        return {"tool_choice": "none"} if has_tools else {}
    fields: dict[str, Any] = {}
    if getattr(choice, "disable_parallel_tool_use", None):
        fields["parallel_tool_calls"] = False
    if isinstance(choice, ToolChoiceAny):
        return fields | {"tool_choice": "required"}
    if isinstance(choice, ToolChoiceTool):
        return fields | {"tool_choice": {"type": "function", "function": {"name": choice.name}}}
    return fields | ({"tool_choice": "auto"} if has_tools else {})
