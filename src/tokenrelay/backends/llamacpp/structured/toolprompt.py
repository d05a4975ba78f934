"""Tools in the prompt: through the chat template when it takes `tools`, else a convention in the system turn.

Templates written for tool use (they read a `tools` variable) describe the tools their own way and render
assistant `tool_calls` and `tool` results themselves, save the calls of a function that takes text (a Lark
custom tool): the template would show JSON, so those are written out in the text form the grammar asks for.
Other templates (the built-in ones, and the default model's) get the tool list and the `toolformat` call
syntax as system instructions, and see earlier calls written in that same syntax, so the model's own past
calls are the examples it continues from.

Under `tool_choice: none` the tools are left out of the prompt entirely: no call is parsed then, and a model
that was not told how to call cannot start one.
"""

from __future__ import annotations

import json
from typing import Any

from tokenrelay.backends.llamacpp.structured import toolformat
from tokenrelay.backends.llamacpp.structured.toolspec import ToolSpec, arguments_schema

SYSTEM_ROLES = ("system", "developer")


def tool_prompt(
    messages: list[dict[str, Any]], spec: ToolSpec | None, template_takes_tools: bool
) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None]:
    """The messages to render and the template's `tools` variable."""
    texts = {f.name for f in spec.functions if f.lark is not None} if spec else set()
    if template_takes_tools:
        return written_text_calls(messages, texts), template_tools(spec) if spec else None
    written = written_calls(named_results(messages), texts)
    return (with_system_text(written, instructions(spec)) if spec else written), None


def template_tools(spec: ToolSpec) -> list[dict[str, Any]]:
    """The template's `tools`: a text-call function's description says how it is called, since the template
    would describe JSON arguments and the grammar asks for the text form."""
    tools = []
    for f in spec.functions:
        function = f.model_dump(exclude_none=True)
        if f.lark is not None:
            function["description"] = " ".join(filter(None, [function.get("description"), _text_form(f.name)]))
        tools.append({"type": "function", "function": function})
    return tools


def instructions(spec: ToolSpec) -> str:
    listed = [
        json.dumps({"name": f.name, "description": f.description or "", "parameters": arguments_schema(f)})
        for f in spec.functions
    ]
    return "\n".join(
        [
            "You can call functions. Each one is listed below as JSON: its name, what it does, and the JSON "
            "Schema of its arguments.",
            *listed,
            "To call a function, write the call exactly in this form, with the arguments as one JSON object:",
            toolformat.call_text("function name", "{...}"),
            *(_text_form(f.name) for f in spec.functions if f.lark is not None),
            "The function's result comes back in a later message.",
            _rule(spec),
        ]
    )


def _text_form(name: str) -> str:
    example = toolformat.text_call(name, "the input")
    return f"`{name}` takes text, not JSON: write its input as it is, on the line after its name: {example}"


def _rule(spec: ToolSpec) -> str:
    if spec.choice == "auto":
        limit = "You may write several calls, one after another." if spec.parallel else "Write at most one call."
        return f"Call a function only when you need its result; otherwise answer normally. {limit}"
    if spec.choice == "required":
        return "You must call at least one function now." if spec.parallel else "You must call one function now."
    return f"You must call the function `{spec.choice}` now."


def written_calls(messages: list[dict[str, Any]], texts: set[str]) -> list[dict[str, Any]]:
    """Assistant turns with their calls written out in the call syntax, after any text they had; calls of the
    functions named in `texts` as text calls."""
    out = []
    for message in messages:
        calls = _calls(message)
        if calls:
            text = "".join(_written(name, arguments, name in texts) for name, arguments in calls)
            content = message.get("content") or ""
            message = {k: v for k, v in message.items() if k not in ("tool_calls", "function_call")}
            message["content"] = f"{content}\n{text}" if content else text
        out.append(message)
    return out


def written_text_calls(messages: list[dict[str, Any]], texts: set[str]) -> list[dict[str, Any]]:
    """For a template that renders calls itself: assistant turns' calls of the functions in `texts` written out
    as text calls after their content (the template would show them as JSON); their other calls stay as they are."""
    out = []
    for message in messages:
        calls = message.get("tool_calls") or [] if message["role"] == "assistant" else []
        as_text = [call for call in calls if call["function"]["name"] in texts]
        if as_text:
            text = "".join(_written(c["function"]["name"], c["function"]["arguments"], True) for c in as_text)
            content = message.get("content") or ""
            kept = [call for call in calls if call not in as_text]
            message = {k: v for k, v in message.items() if k != "tool_calls"}
            message["content"] = f"{content}\n{text}" if content else text
            if kept:
                message["tool_calls"] = kept
        out.append(message)
    return out


def _written(name: str, arguments: str, as_text: bool) -> str:
    try:
        text = json.loads(arguments).get("input") if as_text else None
    except (ValueError, AttributeError):  # not the `{"input": ...}` a text call is sent back as
        text = None
    return toolformat.text_call(name, text) if isinstance(text, str) else toolformat.call_text(name, arguments)


def _calls(message: dict[str, Any]) -> list[tuple[str, str]]:
    if message["role"] != "assistant":
        return []
    calls = [call["function"] for call in message.get("tool_calls") or []]
    if message.get("function_call"):
        calls.append(message["function_call"])
    return [(call["name"], call["arguments"]) for call in calls]


def named_results(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """`tool` results carry the name of the function they answer (looked up by `tool_call_id`) when unnamed."""
    names: dict[str, str] = {}
    out = []
    for message in messages:
        for call in message.get("tool_calls") or []:
            names[call["id"]] = call["function"]["name"]
        if message["role"] == "tool" and not message.get("name") and message.get("tool_call_id") in names:
            message = message | {"name": names[message["tool_call_id"]]}
        out.append(message)
    return out


def with_system_text(messages: list[dict[str, Any]], text: str) -> list[dict[str, Any]]:
    """`text` appended to the leading system message, or as a new one in front."""
    if messages and messages[0]["role"] in SYSTEM_ROLES:
        first = messages[0]
        return [first | {"content": f"{first['content']}\n\n{text}" if first["content"] else text}, *messages[1:]]
    return [{"role": "system", "content": text}, *messages]
