"""Schemathesis hooks for the contract test (`SCHEMATHESIS_HOOKS=contract_hooks`).

They keep generated requests to the rules between values that JSON Schema cannot state, and which the
document says in words. Each needs a value compared with another value of the same request (JSON Schema
compares a value only with constants) or with the clock:
- a named tool choice names one of the `tools` (chat, Messages, Responses): a string equal to a sibling's;
  a forcing choice (`any`, `required`) needs `tools`, which an `if`/`then` could state, but the generator
  then fails to build some bodies (an array with its demanded element), so it is kept here;
- a chat `tool` message answers a call an earlier assistant message made, a Messages `tool_result` block a
  `tool_use` block of an earlier assistant message, and a Responses
  `function_call_output` follows a `function_call` with the same `call_id` (as OpenAI refuses an orphan
  output: there is no call for the model to read the answer of): an id equal to an earlier item's;
- `best_of` is at least `n`, and equals it when streaming: one number compared with another;
- a Messages request ends with a user turn: a property of the array's last item, which `items` cannot single out;
- a key's `expires` is in the future, a usage window's `since`/`until` fit the bucket: judged against the clock.
Every other rule must be in the document itself. The hooks also keep generations short.
"""

from __future__ import annotations

from typing import Any

import schemathesis

from tokenrelay.store.timeutil import parse_expiry, parse_instant, utcnow
from tokenrelay.usage.window import window

MAX_TOKENS = 8


def _path(ctx: Any) -> str:
    return ctx.operation.path if ctx.operation is not None else ""


@schemathesis.hook
def filter_body(ctx: Any, body: Any) -> bool:
    if not isinstance(body, dict):
        return True
    path = _path(ctx)
    if path == "/v1/chat/completions":
        return _choices_named(body) and _tool_answers_made(body)
    if path in ("/v1/messages", "/v1/messages/count_tokens"):
        return _tool_choice_listed(body) and _ends_with_user(body) and _results_answer_uses(body)
    if path == "/v1/responses":
        return _tool_choice_listed(body) and _outputs_answer_calls(body)
    if path == "/v1/completions":
        return _best_of_fits(body)
    if path == "/admin/keys" and isinstance(body.get("expires"), str):
        return _in_future(body["expires"])
    return True


@schemathesis.hook
def map_body(ctx: Any, body: Any) -> Any:
    if isinstance(body, dict) and _path(ctx).startswith("/v1/"):
        for field in ("max_tokens", "max_completion_tokens", "max_output_tokens"):
            if isinstance(body.get(field), int) and body[field] > MAX_TOKENS:
                body[field] = MAX_TOKENS
    return body


@schemathesis.hook
def filter_query(ctx: Any, query: Any) -> bool:
    if _path(ctx) != "/admin/usage/series" or not isinstance(query, dict):
        return True
    try:
        since, until = (parse_instant(query[k]) if query.get(k) else None for k in ("since", "until"))
        window(query.get("bucket", "hour"), since, until, utcnow())
    except (ValueError, OverflowError, KeyError, AttributeError):
        return False  # a value of the wrong kind: the negative cases, which the server refuses anyway
    return True


def _named(choice: Any) -> str | None:
    if not isinstance(choice, dict):
        return None
    function = choice.get("function", choice)
    return function.get("name") if isinstance(function, dict) else None


def _choices_named(body: dict[str, Any]) -> bool:
    tools = [t.get("function", {}).get("name") for t in body.get("tools") or [] if isinstance(t, dict)]
    functions = [f.get("name") for f in body.get("functions") or [] if isinstance(f, dict)]
    for choice, names in ((body.get("tool_choice"), tools), (body.get("function_call"), functions)):
        name = _named(choice)
        if name is not None and name not in names:
            return False
    return True


def _tool_choice_listed(body: dict[str, Any]) -> bool:
    """Messages' `{"type": "tool", "name"}` and Responses' `{"type": "function", "name"}` name one of the `tools`;
    a choice that forces a call (Messages' `any`, Responses' `required`) needs some `tools`."""
    choice = body.get("tool_choice")
    name = _named(choice)
    tools = [t.get("name") for t in body.get("tools") or [] if isinstance(t, dict)]
    forced = choice == "required" or (isinstance(choice, dict) and choice.get("type") == "any")
    return (name is None or name in tools) and not (forced and not tools)


def _ends_with_user(body: dict[str, Any]) -> bool:
    """Messages: the last message is the user's (continuing an assistant message is not served)."""
    messages = body.get("messages")
    return not isinstance(messages, list) or not messages or _role(messages[-1]) == "user"


def _outputs_answer_calls(body: dict[str, Any]) -> bool:
    """Responses: each `function_call_output` item follows a `function_call` item with its `call_id`."""
    items = body.get("input")
    if not isinstance(items, list):
        return True
    made: set[Any] = set()
    for item in items:
        if not isinstance(item, dict):
            continue
        if item.get("type") == "function_call":
            made.add(_id(item.get("call_id")))
        elif item.get("type") == "function_call_output" and _id(item.get("call_id")) not in made:
            return False
    return True


def _results_answer_uses(body: dict[str, Any]) -> bool:
    """Messages: each `tool_result` block answers a `tool_use` block of an earlier assistant message."""
    made: set[str | None] = set()
    for message in body.get("messages") or []:
        content = message.get("content") if isinstance(message, dict) else None
        for block in content if isinstance(content, list) else []:
            if not isinstance(block, dict):
                continue
            if block.get("type") == "tool_use":
                made.add(_id(block.get("id")))
            elif block.get("type") == "tool_result" and _id(block.get("tool_use_id")) not in made:
                return False
    return True


def _id(value: Any) -> str | None:
    """An id as sent (a generated invalid body may hold anything there, which matches no id)."""
    return value if isinstance(value, str) else None


def _role(message: Any) -> Any:
    return message.get("role") if isinstance(message, dict) else None


def _tool_answers_made(body: dict[str, Any]) -> bool:
    made: set[Any] = set()
    for message in body.get("messages") or []:
        if not isinstance(message, dict):
            continue
        if message.get("role") == "assistant":
            made.update(_id(c.get("id")) for c in message.get("tool_calls") or [] if isinstance(c, dict))
        elif message.get("role") == "tool" and _id(message.get("tool_call_id")) not in made:
            return False
    return True


def _best_of_fits(body: dict[str, Any]) -> bool:
    best_of, n = body.get("best_of"), body.get("n") or 1
    if best_of is None:
        return True
    return best_of >= n and not (body.get("stream") and best_of > n)


def _in_future(expires: str) -> bool:
    try:
        return parse_expiry(expires) > utcnow()
    except (ValueError, OverflowError):
        return False
