"""A Responses request → the `ChatCompletionRequest` every backend serves, and back.

Input items are first normalised into the items `input_items` lists and the store keeps (plain dicts with
ids, content as parts); the conversation (a previous response's items, then this request's) becomes chat
messages. Errors the chat layer reports against `messages.N` are put back on the item they came from.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from tokenrelay.api.parsing import validate_json
from tokenrelay.errors import UNSUPPORTED_CONTENT, APIError, InvalidRequest
from tokenrelay.jsonbytes import dumps
from tokenrelay.openai.responses.ids import new_id
from tokenrelay.openai.responses.protocol import (
    InputItem,
    MessageItem,
    ResponsesRequest,
    TextFormatJsonObject,
    TextFormatJsonSchema,
)
from tokenrelay.protocol.chat import ChatCompletionRequest

Item = dict[str, Any]
ID_PREFIXES = {
    "message": "msg",
    "function_call": "fc",
    "function_call_output": "fco",
    "custom_tool_call": "ctc",
    "custom_tool_call_output": "ctco",
    "reasoning": "rs",
}
CALLS = ("function_call", "custom_tool_call")
ANSWERS = ("function_call_output", "custom_tool_call_output")


# Input → stored items ------------------------------------------------------------------------------
def input_items(body: ResponsesRequest) -> list[Item]:
    """The request's input as items with ids; a string is one user message."""
    if isinstance(body.input, str):
        return [_message(None, "user", [{"type": "input_text", "text": body.input}])]
    return [_item(item) for item in body.input]


def _item(item: InputItem) -> Item:
    if isinstance(item, MessageItem):
        content = item.content
        if isinstance(content, str):
            kind = "output_text" if item.role == "assistant" else "input_text"
            parts: list[Item] = [{"type": kind, "text": content}]
        else:
            parts = [part.model_dump(mode="json", exclude_none=True) for part in content]
        return _message(item.id, item.role, parts)
    dumped = item.model_dump(mode="json", exclude_none=True)
    return {"id": item.id or new_id(ID_PREFIXES[item.type]), **dumped, "status": "completed"}


def _message(item_id: str | None, role: str, parts: list[Item]) -> Item:
    return {"id": item_id or new_id("msg"), "type": "message", "role": role, "status": "completed", "content": parts}


# Conversation → chat messages ----------------------------------------------------------------------
@dataclass
class Conversation:
    """The items a request is answered from: a previous response's (`context`) and this request's own."""

    context: list[Item]
    items: list[Item]
    dropped: int = 0  # oldest items left out to fit the model's context (`truncation: auto`)
    origins: list[str] = field(default_factory=list)  # each chat message's source, as a `param`

    @property
    def kept(self) -> list[Item]:
        return [*self.context, *self.items][self.dropped :]

    def drop_oldest(self) -> bool:
        """Leave out the oldest item, and the function outputs it leaves without their call. False when
        nothing more can go (one item left)."""
        kept = self.kept
        if len(kept) <= 1:
            return False
        drop = 1
        calls = {item["call_id"] for item in kept[1:] if item["type"] in CALLS}
        while drop < len(kept) - 1 and kept[drop]["type"] in ANSWERS:
            if kept[drop]["call_id"] in calls:
                break
            drop += 1
        self.dropped += drop
        return True

    def origin(self, position: int) -> str:
        """The `param` naming the item at `position` of `kept`."""
        absolute = position + self.dropped
        if absolute < len(self.context):
            return "previous_response_id"
        return f"input.{absolute - len(self.context)}"


def chat_request(body: ResponsesRequest, conversation: Conversation) -> ChatCompletionRequest:
    """The chat request that answers `body` from `conversation`. Validated as `/v1/chat/completions` validates
    its bodies (from JSON, strictly), so both endpoints accept and refuse the same things."""
    messages, origins = _messages(body, conversation)
    conversation.origins = origins
    chat: dict[str, Any] = {"model": body.model, "messages": messages, "stream": bool(body.stream)}
    simple = {
        "max_completion_tokens": body.max_output_tokens,
        "temperature": body.temperature,
        "top_p": body.top_p,
        "user": body.user,
        "parallel_tool_calls": body.parallel_tool_calls,
    }
    chat.update({name: value for name, value in simple.items() if value is not None})
    cache_key = (body.model_extra or {}).get("prompt_cache_key")
    if isinstance(cache_key, str):  # routes the conversation's turns to one node, whose cache holds it
        chat["prompt_cache_key"] = cache_key
    functions = body.functions
    if functions:
        chat["tools"] = [
            {"type": "function", "function": _function(tool.model_dump()) | {"name": shown}}
            for shown, (tool, _) in functions.items()
        ]
    if body.tool_choice is not None:
        choice = body.tool_choice
        chat["tool_choice"] = (
            choice if isinstance(choice, str) else {"type": "function", "function": {"name": choice.name}}
        )
    response_format = _response_format(body)
    if response_format is not None:
        chat["response_format"] = response_format
    try:
        request = validate_json(ChatCompletionRequest, dumps(chat))
    except APIError as exc:
        raise relocated(exc, conversation) from None
    for tool in request.tools or []:
        grammar = body.lark_grammars.get(tool.function.name)
        if grammar is not None:
            tool.function.follow_lark(grammar)
    return request


def _function(tool: dict[str, Any]) -> dict[str, Any]:
    return {name: value for name, value in tool.items() if name != "type" and value is not None}


def _response_format(body: ResponsesRequest) -> dict[str, Any] | None:
    fmt = body.text.format if body.text is not None else None
    if isinstance(fmt, TextFormatJsonObject):
        return {"type": "json_object"}
    if isinstance(fmt, TextFormatJsonSchema):
        schema = {"name": fmt.name, "schema": fmt.schema_, "description": fmt.description, "strict": fmt.strict}
        return {"type": "json_schema", "json_schema": {k: v for k, v in schema.items() if v is not None}}
    return None


def _messages(body: ResponsesRequest, conversation: Conversation) -> tuple[list[Item], list[str]]:
    messages: list[Item] = []
    origins: list[str] = []
    if body.instructions is not None:
        messages.append({"role": "system", "content": body.instructions})
        origins.append("instructions")
    made: set[str] = set()
    for position, item in enumerate(conversation.kept):
        where = conversation.origin(position)
        if item["type"] == "reasoning":
            continue  # the model's own earlier thinking: chat has no place for it
        if item["type"] in CALLS:
            made.add(item["call_id"])
            call = {"id": item["call_id"], "type": "function", "function": _call(body, item)}
            last = messages[-1] if messages else None
            if last is not None and last["role"] == "assistant":
                last.setdefault("tool_calls", []).append(call)  # one assistant turn: its text and its calls
                continue
            messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif item["type"] in ANSWERS:
            _check_answer(item, made, where)
            messages.append(
                {"role": "tool", "tool_call_id": item["call_id"], "content": _content(item["output"], where)}
            )
        else:
            messages.append({"role": item["role"], "content": _content(item["content"], where)})
        origins.append(where)
    return messages, origins


def _call(body: ResponsesRequest, item: Item) -> Item:
    if item["type"] == "custom_tool_call":  # shown to the model as a function of one string
        return {"name": item["name"], "arguments": dumps({"input": item["input"]}).decode()}
    return {"name": body.shown_name(item["name"], item.get("namespace")), "arguments": item["arguments"]}


def _check_answer(item: Item, made: set[str], where: str) -> None:
    if item["call_id"] not in made:
        raise InvalidRequest(
            f"No call item with call_id {item['call_id']!r} comes before this {item['type']}.",
            param=f"{where}.call_id" if where.startswith("input") else where,
        )


def _content(content: str | list[Item], where: str) -> str | list[Item]:
    """Text parts as one string (what chat templates take); an image part makes it a list of chat parts."""
    if isinstance(content, str):
        return content
    parts = [_chat_part(part, f"{where}.content.{j}") for j, part in enumerate(content)]
    if all(part["type"] == "text" for part in parts):
        return "".join(part["text"] for part in parts)
    return parts


def _chat_part(part: Item, where: str) -> Item:
    kind = part["type"]
    if kind in ("input_text", "output_text"):
        return {"type": "text", "text": part["text"]}
    if kind == "refusal":
        return {"type": "text", "text": part["refusal"]}
    if kind == "input_image" and part.get("image_url"):
        return {"type": "image_url", "image_url": {"url": part["image_url"], "detail": part.get("detail", "auto")}}
    what = "file ids" if kind == "input_image" else "input_file parts"
    raise InvalidRequest(
        f"This server has no Files API, so {what} cannot be read; send images as `image_url`.",
        param=where,
        code=UNSUPPORTED_CONTENT,
    )


# Chat parameters and what a Responses request calls them.
CHAT_NAMES = {
    "messages": "input",
    "max_completion_tokens": "max_output_tokens",
    "max_tokens": "max_output_tokens",
    "response_format": "text.format",
}


def relocated(exc: APIError, conversation: Conversation) -> APIError:
    """`exc` in the terms of the Responses request: a `param` about `messages.N...` is put on the input item
    that message came from, and chat's parameter names become this API's."""
    param = exc.param or ""
    head, _, rest = param.partition(".")
    index, _, tail = rest.partition(".")
    terms = [(chat, name) for chat, name in CHAT_NAMES.items() if chat != "messages"]
    if head == "messages" and index.isdigit() and int(index) < len(conversation.origins):
        origin = conversation.origins[int(index)]
        exc.param = f"{origin}.{tail}" if tail and origin.startswith("input") else origin
        terms = [(f"messages.{index}", origin), (f"messages[{index}]", origin), ("image_url", "input_image"), *terms]
    elif param in CHAT_NAMES:
        exc.param = CHAT_NAMES[param]
    else:
        return exc
    for chat_term, term in terms:
        exc.message = exc.message.replace(chat_term, term)
    return exc
