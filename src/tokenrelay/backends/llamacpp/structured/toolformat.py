"""How a tool call is written in the model's output: the one convention the prompt, grammar and parser share.

    <tool_call>{"name":"get_weather","arguments":{"city":"Paris"}}</tool_call>

This is the Hermes/Qwen `<tool_call>` layout (so chat templates that describe tools in that style teach the
model this very form), written compactly: the envelope is fixed text, only the arguments are generated.
Several calls follow one another directly. No separator is offered between them on purpose: measured on the
default model, a newline after `</tool_call>` was its favourite next token and always led into another call
(until max_tokens), while without one it ended its turn after the calls it meant to make.

A function whose input is text following a Lark grammar (a Responses custom tool) is called with the text as it
is, on the line after its name, since a grammar over raw text cannot be enforced inside a JSON string:

    <tool_call>{"name":"apply_patch"}
    *** Begin Patch ...</tool_call>
"""

from __future__ import annotations

import json

OPEN = "<tool_call>"
CLOSE = "</tool_call>"
TAIL = "}" + CLOSE  # closes the envelope object, then the call


def head(name: str) -> str:
    """Everything of a call before its arguments."""
    return OPEN + '{"name":' + json.dumps(name) + ',"arguments":'


def call_text(name: str, arguments: str) -> str:
    return head(name) + arguments + TAIL


def text_head(name: str) -> str:
    """Everything of a text call before its text."""
    return OPEN + '{"name":' + json.dumps(name) + "}\n"


def text_call(name: str, text: str) -> str:
    return text_head(name) + text + CLOSE
