"""Response objects (`object: "response"`) and their output items, as OpenAI's Responses API has them."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from tokenrelay.api.collect import Collected, reasoning_text
from tokenrelay.backends.base import Usage
from tokenrelay.errors import APIError
from tokenrelay.openai.responses.ids import new_id
from tokenrelay.openai.responses.protocol import FunctionChoice, ResponsesRequest

Item = dict[str, Any]
# Chat finish reasons that leave a response incomplete, and the reason it then gives.
INCOMPLETE = {"length": "max_output_tokens", "content_filter": "content_filter"}


@dataclass(slots=True)
class ResponseHead:
    """What a response is from its start: its id, its time and the request it answers."""

    id: str
    created_at: int
    body: ResponsesRequest
    served_model: str | None = None  # the fallback that serves, once one does

    @property
    def model(self) -> str:
        return self.served_model or self.body.model


def usage_body(usage: Usage) -> dict[str, Any]:
    return {
        "input_tokens": usage.prompt_tokens,
        "input_tokens_details": {"cached_tokens": usage.cached_tokens},
        "output_tokens": usage.completion_tokens,
        "output_tokens_details": {"reasoning_tokens": usage.reasoning_tokens},
        "total_tokens": usage.total_tokens,
    }


def outcome(finish_reason: str | None) -> tuple[str, str | None]:
    """The response's status, and why it is incomplete (None when it is not)."""
    reason = INCOMPLETE.get(finish_reason or "")
    return ("incomplete", reason) if reason is not None else ("completed", None)


def error_body(exc: APIError) -> dict[str, Any]:
    return {"code": exc.code or exc.type, "message": exc.message}


def response_object(
    head: ResponseHead,
    status: str,
    output: list[Item],
    usage: Usage | None = None,
    *,
    incomplete: str | None = None,
    error: dict[str, Any] | None = None,
) -> dict[str, Any]:
    body = head.body
    return {
        "id": head.id,
        "object": "response",
        "created_at": head.created_at,
        "status": status,
        "background": False,
        "error": error,
        "incomplete_details": {"reason": incomplete} if incomplete is not None else None,
        "instructions": body.instructions,
        "max_output_tokens": body.max_output_tokens,
        "max_tool_calls": None,
        "model": head.model,
        "output": output,
        "parallel_tool_calls": body.parallel_tool_calls is not False,
        "previous_response_id": body.previous_response_id,
        "reasoning": {"effort": None, "summary": None},
        "service_tier": "default",
        "store": body.store is not False,
        "temperature": 1.0 if body.temperature is None else body.temperature,
        "text": {"format": _format(body)},
        "tool_choice": _tool_choice(body),
        "tools": [tool.model_dump(mode="json") for tool in body.tools or []],
        "top_logprobs": 0,
        "top_p": 1.0 if body.top_p is None else body.top_p,
        "truncation": body.truncation or "disabled",
        "usage": usage_body(usage) if usage is not None else None,
        "user": body.user,
        "metadata": body.metadata or {},
    }


def _format(body: ResponsesRequest) -> dict[str, Any]:
    fmt = body.text.format if body.text is not None else None
    return {"type": "text"} if fmt is None else fmt.model_dump(mode="json", by_alias=True, exclude_none=True)


def _tool_choice(body: ResponsesRequest) -> Any:
    choice = body.tool_choice
    if isinstance(choice, FunctionChoice):
        return {"type": choice.type, "name": choice.name}
    return choice or "auto"


# Output items --------------------------------------------------------------------------------------
def text_part(text: str) -> Item:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def message_item(item_id: str, status: str, parts: list[Item]) -> Item:
    return {"id": item_id, "type": "message", "role": "assistant", "status": status, "content": parts}


def function_call_item(
    body: ResponsesRequest, item_id: str, call_id: str, shown: str, arguments: str, status: str
) -> Item:
    """A call of the function the model knows as `shown`: by its own name, with its namespace if it has one; a
    custom tool's call with its text input."""
    if shown in body.custom:
        item = {"id": item_id, "type": "custom_tool_call", "call_id": call_id, "name": shown}
        return item | {"input": custom_input(arguments), "status": status}
    name, namespace = body.called(shown)
    item = {"id": item_id, "type": "function_call", "call_id": call_id, "name": name, "arguments": arguments}
    return item | ({"namespace": namespace} if namespace is not None else {}) | {"status": status}


def custom_input(arguments: str) -> str:
    """A custom tool's text from the arguments of the function it was shown as (`{"input": ...}`); arguments of
    another shape are the text itself."""
    try:
        decoded = json.loads(arguments)
    except ValueError:
        return arguments
    text = decoded.get("input") if isinstance(decoded, dict) else None
    return text if isinstance(text, str) else arguments


def reasoning_item(item_id: str, status: str, text: str) -> Item:
    """A node's reasoning, as OpenAI's open-weight models give theirs: the text itself, no summary."""
    content = [{"type": "reasoning_text", "text": text}]
    return {"id": item_id, "type": "reasoning", "summary": [], "content": content, "status": status}


def collected_response(head: ResponseHead, collected: Collected) -> dict[str, Any]:
    """The whole response for a non-streamed request: the reasoning if any, the answer's text as a message, then
    its calls."""
    choice = collected.choice(0)
    status, incomplete = outcome(choice.finish_reason)
    item_status = "incomplete" if incomplete else "completed"
    text = "".join(choice.text)
    calls = [choice.tool_calls[i] for i in sorted(choice.tool_calls)]
    output: list[Item] = []
    if thinking := reasoning_text(choice.extras):
        output.append(reasoning_item(new_id("rs"), item_status, thinking))
    if text or not calls:
        output.append(message_item(new_id("msg"), item_status, [text_part(text)]))
    for call in calls:
        call_id = call.id or new_id("call")
        item = function_call_item(head.body, new_id("fc"), call_id, call.name or "", call.arguments, item_status)
        output.append(item)
    return response_object(head, status, output, collected.usage, incomplete=incomplete)


def item_list(items: list[Item], *, limit: int, order: str, after: str | None) -> dict[str, Any]:
    """One page of a response's input items as a list object (`after` is the last id of the previous page)."""
    ordered = items if order == "asc" else items[::-1]
    if after is not None:
        ids = [item.get("id") for item in ordered]
        ordered = ordered[ids.index(after) + 1 :] if after in ids else []
    page = ordered[:limit]
    return {
        "object": "list",
        "data": page,
        "first_id": page[0]["id"] if page else None,
        "last_id": page[-1]["id"] if page else None,
        "has_more": len(ordered) > limit,
    }
