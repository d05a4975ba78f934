"""Schemathesis hooks for the contract test, named by `schemathesis.toml` (so a plain `schemathesis run` in this
checkout uses them too).

They keep generated requests to the rules between values that JSON Schema cannot state, and which the
document says in words. Each needs a value compared with another value of the same request (JSON Schema
compares a value only with constants) or with the clock:
- a named tool choice names one of the `tools` (chat, Messages, Responses): a string equal to a sibling's;
  a forcing choice (`any`, `required`) needs `tools`, which an `if`/`then` could state, but the generator
  then fails to build some bodies (an array with its demanded element), so it is kept here;
- a chat `tool` message answers a call an earlier assistant message made, a Messages `tool_result` block a
  `tool_use` block of an earlier assistant message, and a Responses `function_call_output` (or
  `custom_tool_call_output`) follows a call item with the same `call_id` (as OpenAI refuses an orphan output:
  there is no call for the model to read the answer of): an id equal to an earlier item's;
- `best_of` is at least `n`, and equals it when streaming: one number compared with another;
- chat sends `tools` or the legacy `functions`, not both: two fields judged together;
- the tools (or legacy `functions`) of a request have different names: a property compared across items,
  which `uniqueItems` (whole items) cannot say;
- a last message that is continued (a Messages prefill, chat's `continue_final_message`) is an assistant's with
  text only: a property of the array's last item, which `items` cannot single out;
- a key's `expires` is in the future, a usage window's `since`/`until` fit the bucket: judged against the clock;
- a Responses input of reasoning items alone (which the model is not shown) comes with `instructions`: an array
  judged by the kinds of all its items;
- a node URL's IPv6 literal is an IPv6 address: the document gives the URL's shape, the standard library the
  address forms RFC 3986 allows (a pattern for all of them would be a page long).
Invalid cases are all kept but one kind: an upload form whose extra field is a number, boolean or null, which a
multipart form can only send as text, so the server receives a valid field.
Every other rule must be in the document itself.

The document names the served models as examples of `model`, so valid requests reach them. What a model can
do is its own, and a valid request that asks for more is refused (a 400 naming the field), so the hooks also
keep to what the default models can do: read text only (no images, audio or files), no fill-in-the-middle
(`suffix`), no shortened embeddings (`dimensions`), token ids within the smaller vocabulary. And they keep
generations short (`MAX_TOKENS`), also where the request sets no limit, and put the nodes that registrations
add (which do not exist) under models of their own.
"""

from __future__ import annotations

import re
from typing import Any

import schemathesis

from tokenrelay.config import node_url_problem
from tokenrelay.store.timeutil import parse_expiry, parse_instant, utcnow
from tokenrelay.usage.window import window

MAX_TOKENS = 8
SMALLEST_VOCABULARY = 49_152  # smollm2-135m-instruct's; gemma-3-270m's is larger
# Content of other kinds than text, in chat (`image_url`, `input_audio`, `file`), Messages (`image`) and
# Responses (`input_image`, `input_file`).
MEDIA = frozenset({"image_url", "input_audio", "file", "image", "input_image", "input_file"})
NODE_MODELS = "contract-node-"  # the prefix of the models generated node registrations serve
# Each generation endpoint's output limit, set where a valid request leaves it out.
LIMITS = {
    "/v1/chat/completions": ("max_tokens", "max_completion_tokens"),
    "/v1/completions": ("max_tokens",),
    "/v1/responses": ("max_output_tokens",),
    "/v1/messages": ("max_tokens",),
}


@schemathesis.hook
def filter_case(ctx: Any, case: Any) -> bool:
    """Keeps a valid case only if it keeps the rules between fields too. Invalid cases (values of any type)
    are the server's to refuse, and are all kept. Case hooks, not body or query hooks: the coverage phase
    applies only these."""
    path, body, query = case.operation.path, case.body, case.query
    if case.meta is not None and not case.meta.generation.mode.is_positive:
        return not (path == "/v1/files" and isinstance(body, dict) and _scalar_beside_file(body))

    if isinstance(body, dict) and not (_body_fits(path, body) and _within_models(path, body)):
        return False
    if path == "/admin/usage/series" and isinstance(query, dict):
        return _window_fits(query)
    return True


@schemathesis.hook
def map_case(ctx: Any, case: Any) -> Any:
    """Valid cases only: an invalid one changed might become valid (and be accepted, as it then should)."""
    body, path = case.body, case.operation.path
    if not isinstance(body, dict) or (case.meta is not None and not case.meta.generation.mode.is_positive):
        return case
    if path == "/admin/nodes":
        _own_model(body)
    limits = LIMITS.get(path, ())
    for field in limits:
        if isinstance(body.get(field), int) and body[field] > MAX_TOKENS:
            body[field] = MAX_TOKENS
    if limits and all(body.get(field) is None for field in limits):
        body[limits[0]] = MAX_TOKENS
    return case


@schemathesis.hook
def before_add_examples(ctx: Any, examples: list[Any]) -> None:
    """The examples phase applies no case hooks; its cases get the same treatment here."""
    kept = [map_case(ctx, case) for case in examples if filter_case(ctx, case)]
    examples[:] = kept


def _scalar_beside_file(form: dict[str, Any]) -> bool:
    """An upload form with an extra field that is a number, boolean or null: a form carries every value as text,
    so the server receives valid text ("null", "1"), and such a case is not invalid on the wire."""
    extra = [value for name, value in form.items() if name not in {"file", "purpose"}]
    return any(value is None or isinstance(value, bool | int | float) for value in extra)


def _own_model(registration: dict[str, Any]) -> None:
    """A registered node for a model of its own: the generated nodes do not exist, and a model served by one
    answers 502, as it should; other operations' requests name other models (as often as not `0`)."""
    model = registration.get("model_id")
    if isinstance(model, str) and model:
        registration["model_id"] = (NODE_MODELS + model)[:256]


def _within_models(path: str, body: dict[str, Any]) -> bool:
    """What the default models can do (see the module's docstring)."""
    if path == "/v1/completions" and body.get("suffix") is not None:
        return False
    if path == "/v1/embeddings" and body.get("dimensions") is not None:
        return False
    return not _has_media(body) and all(0 <= t < SMALLEST_VOCABULARY for t in _token_ids(path, body))


def _has_media(value: Any) -> bool:
    if isinstance(value, dict):
        kind = value.get("type")
        return (isinstance(kind, str) and kind in MEDIA) or any(_has_media(v) for v in value.values())
    return isinstance(value, list) and any(_has_media(v) for v in value)


def _token_ids(path: str, body: dict[str, Any]) -> list[int]:
    """Token ids of the request: prompts and inputs given as ids, `/detokenize`'s tokens, `logit_bias` keys."""
    given = {"/v1/completions": "prompt", "/v1/embeddings": "input", "/detokenize": "tokens"}.get(path)
    ids = _ints(body.get(given)) if given else []
    bias = body.get("logit_bias")
    if isinstance(bias, dict):
        ids += [int(key) for key in bias if isinstance(key, str) and re.fullmatch(r"-?[0-9]+", key)]
    return ids


def _ints(value: Any) -> list[int]:
    if isinstance(value, list):
        return [i for item in value for i in _ints(item)]
    return [value] if _is_int(value) else []


def _body_fits(path: str, body: dict[str, Any]) -> bool:
    if not _names_unique(body):
        return False
    if path == "/tokenize" and "messages" in body:  # chat's messages, tools and continuation
        return _choices_named(body) and _tool_answers_made(body) and _continues_an_assistant(body)
    if path == "/v1/chat/completions":
        one_kind = not (body.get("tools") and body.get("functions"))
        return one_kind and _choices_named(body) and _tool_answers_made(body) and _continues_an_assistant(body)
    if path in ("/v1/messages", "/v1/messages/count_tokens"):
        return _tool_choice_listed(body) and _prefill_is_text(body) and _results_answer_uses(body)
    if path == "/v1/responses":
        return _tool_choice_listed(body) and _outputs_answer_calls(body) and _something_to_answer(body)
    if path == "/v1/completions":
        return _best_of_fits(body)
    if path == "/admin/keys" and isinstance(body.get("expires"), str):
        return _in_future(body["expires"])
    if path == "/admin/nodes" and isinstance(body.get("url"), str):
        return node_url_problem(body["url"]) is None
    return True


def _window_fits(query: dict[str, Any]) -> bool:
    try:
        since, until = (parse_instant(query[k]) if query.get(k) else None for k in ("since", "until"))
        window(query.get("bucket", "hour"), since, until, utcnow())
    except (ValueError, OverflowError, KeyError, AttributeError, TypeError):
        return False  # a value of the wrong kind: the negative cases, which the server refuses anyway
    return True


def _something_to_answer(body: dict[str, Any]) -> bool:
    """Reasoning items are not shown to the model: a Responses input of nothing else, without `instructions`,
    leaves it nothing to answer."""
    items = body.get("input")
    if not isinstance(items, list) or isinstance(body.get("instructions"), str):
        return True
    return any(not (isinstance(item, dict) and item.get("type") == "reasoning") for item in items)


def _names_unique(body: dict[str, Any]) -> bool:
    for field in ("tools", "functions"):
        items = body.get(field)
        names = [_tool_name(item) for item in items] if isinstance(items, list) else []
        if len(names) != len(set(names)):
            return False
    return True


def _tool_name(tool: Any) -> Any:
    """A tool's name: nested in chat's `function`, flat in Messages and Responses and legacy `functions`."""
    if not isinstance(tool, dict):
        return id(tool)  # no name: unique
    function = tool.get("function")
    name = function.get("name") if isinstance(function, dict) else tool.get("name")
    return name if isinstance(name, str) else id(tool)


def _named(choice: Any) -> Any:
    """The name a tool choice gives (anything a generated body holds there), or None."""
    if not isinstance(choice, dict):
        return None
    function = choice.get("function", choice)
    return function.get("name") if isinstance(function, dict) else None


def _items(value: Any) -> list[Any]:
    """An array's items; nothing for a value of another kind (a generated body may hold anything)."""
    return value if isinstance(value, list) else []


def _choices_named(body: dict[str, Any]) -> bool:
    chat_tools = [t.get("function") for t in _items(body.get("tools")) if isinstance(t, dict)]
    tools = [function.get("name") for function in chat_tools if isinstance(function, dict)]
    functions = [f.get("name") for f in _items(body.get("functions")) if isinstance(f, dict)]
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
    tools = [t.get("name") for t in _items(body.get("tools")) if isinstance(t, dict)]
    forced = choice == "required" or (isinstance(choice, dict) and choice.get("type") == "any")
    return (name is None or name in tools) and not (forced and not tools)


def _prefill_is_text(body: dict[str, Any]) -> bool:
    """Messages: a last assistant message (a prefill) holds no `tool_use` block."""
    messages = body.get("messages")
    last = messages[-1] if isinstance(messages, list) and messages else None
    if _role(last) != "assistant" or not isinstance(last.get("content"), list):
        return True
    return not any(isinstance(block, dict) and block.get("type") == "tool_use" for block in last["content"])


def _continues_an_assistant(body: dict[str, Any]) -> bool:
    """Chat: `continue_final_message` needs a last assistant message without tool calls."""
    messages = body.get("messages")
    if body.get("continue_final_message") is not True or not isinstance(messages, list) or not messages:
        return True
    last = messages[-1]
    return _role(last) == "assistant" and not (last.get("tool_calls") or last.get("function_call"))


def _outputs_answer_calls(body: dict[str, Any]) -> bool:
    """Responses: each `function_call_output` (or `custom_tool_call_output`) item follows a call item with its
    `call_id`."""
    items = body.get("input")
    if not isinstance(items, list):
        return True
    calls, answers = ("function_call", "custom_tool_call"), ("function_call_output", "custom_tool_call_output")
    return _answers_follow_calls(items, (calls, "call_id"), (answers, "call_id"))


def _results_answer_uses(body: dict[str, Any]) -> bool:
    """Messages: each `tool_result` block answers a `tool_use` block of an earlier assistant message."""
    blocks = []
    for message in _items(body.get("messages")):
        content = message.get("content") if isinstance(message, dict) else None
        blocks += _items(content)
    return _answers_follow_calls(blocks, (("tool_use",), "id"), (("tool_result",), "tool_use_id"))


def _answers_follow_calls(
    items: list[Any], call: tuple[tuple[str, ...], str], answer: tuple[tuple[str, ...], str]
) -> bool:
    """Each item of a type in `answer[0]` names, in its field `answer[1]`, the id (`call[1]`) of an earlier item of
    a type in `call[0]`."""
    made: set[str | None] = set()
    for item in items:
        if not isinstance(item, dict):
            continue
        if item.get("type") in call[0]:
            made.add(_id(item.get(call[1])))
        elif item.get("type") in answer[0] and _id(item.get(answer[1])) not in made:
            return False
    return True


def _id(value: Any) -> str | None:
    """An id as sent (a generated invalid body may hold anything there, which matches no id)."""
    return value if isinstance(value, str) else None


def _role(message: Any) -> Any:
    return message.get("role") if isinstance(message, dict) else None


def _tool_answers_made(body: dict[str, Any]) -> bool:
    made: set[Any] = set()
    for message in _items(body.get("messages")):
        if not isinstance(message, dict):
            continue
        if message.get("role") == "assistant":
            made.update(_id(c.get("id")) for c in _items(message.get("tool_calls")) if isinstance(c, dict))
        elif message.get("role") == "tool" and _id(message.get("tool_call_id")) not in made:
            return False
    return True


def _best_of_fits(body: dict[str, Any]) -> bool:
    best_of, n = body.get("best_of"), body.get("n") or 1
    if not (_is_number(best_of) and _is_number(n)):
        return True  # not both numbers: nothing to compare
    return best_of >= n and not (body.get("stream") and best_of > n)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return _is_int(value) or isinstance(value, float)


def _in_future(expires: str) -> bool:
    try:
        return parse_expiry(expires) > utcnow()
    except (ValueError, OverflowError):
        return False
