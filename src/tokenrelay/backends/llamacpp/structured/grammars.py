"""The grammar a chat request's output must follow: a JSON Schema, tool calls, or both (Lark for llguidance)."""

from __future__ import annotations

import json
import re
from typing import Any

from llguidance import LLMatcher

from tokenrelay.backends.llamacpp.structured import toolformat
from tokenrelay.backends.llamacpp.structured.schemas import inline_json, json_grammar
from tokenrelay.backends.llamacpp.structured.toolspec import ToolSpec, arguments_schema
from tokenrelay.errors import InvalidRequest


def output_grammar(tools: ToolSpec | None, content: dict[str, Any] | None) -> str | None:
    """None for free text; otherwise an llguidance grammar.

    `content` is the schema plain answers must follow (response_format), if any. Under a forced tool choice
    the answer is calls only; under `auto` it is either an answer or calls, never both interleaved.
    """
    if tools is None:
        return None if content is None else json_grammar(content)
    # Each Lark grammar of a text call is a grammar of its own (`@text_i`), so its rule names are its own.
    texts = [
        {"name": f"text_{i}", "lark_grammar": function.lark}
        for i, function in enumerate(tools.callable)
        if function.lark is not None
    ]
    grammar = json.dumps({"grammars": [{"lark_grammar": _lark(tools, content)}, *texts]})
    failed, messages = LLMatcher.validate_grammar_with_warnings(grammar)
    if failed:
        raise InvalidRequest(f"The tools cannot be enforced together: {'; '.join(messages)}", param="tools")
    return grammar


def _lark(tools: ToolSpec, content: dict[str, Any] | None) -> str:
    free_text = not tools.forced and content is None
    rules = [f"start: {'calls' if tools.forced else 'answer | calls'}"]
    if not tools.forced:
        rules.append(f"answer: {'TEXT' if content is None else inline_json(content)}")
    if free_text:
        # The lead is lazy: it ends at the first opening marker, so once the model writes `<tool_call>` it is
        # inside a call whose arguments are enforced, and a plain answer can never hold a half-made call.
        rules.append(r"TEXT: /(.|\n)*/")
        rules.append(f"lead[lazy]: /(.|\\n)*{re.escape(toolformat.OPEN)}/")
    opener = "lead" if free_text else json.dumps(toolformat.OPEN)
    rules.append(f"calls: {opener} body{_more(tools)}")
    rules.append("body: " + " | ".join(f"call_{i}" for i in range(len(tools.callable))))
    for i, function in enumerate(tools.callable):
        if function.lark is not None:
            head = toolformat.text_head(function.name).removeprefix(toolformat.OPEN)
            rules.append(f"call_{i}: {json.dumps(head)} @text_{i} {json.dumps(toolformat.CLOSE)}")
            continue
        head = toolformat.head(function.name).removeprefix(toolformat.OPEN)
        rules.append(f"call_{i}: {json.dumps(head)} args_{i} {json.dumps(toolformat.TAIL)}")
        rules.append(f"args_{i}: {inline_json(arguments_schema(function), lenient=True)}")
    return "\n".join(rules) + "\n"


def _more(tools: ToolSpec) -> str:
    """Further calls, when parallel calls are allowed (directly after the previous one; see `toolformat`)."""
    if not tools.parallel:
        return ""
    return f" ({json.dumps(toolformat.OPEN)} body)*"
