"""A chat request's output contract on the embedded engine: the grammar to sample under, and tool parsing."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tokenrelay.backends.llamacpp.structured.grammars import output_grammar
from tokenrelay.backends.llamacpp.structured.schemas import ANY_OBJECT, check_schema
from tokenrelay.backends.llamacpp.structured.toolspec import ToolSpec, tool_spec
from tokenrelay.protocol.chat import ChatCompletionRequest, ResponseFormat


@dataclass(frozen=True, slots=True)
class OutputPlan:
    grammar: str | None  # llguidance grammar every choice is sampled under; None for free text
    tools: ToolSpec | None  # how output text is read for calls; None when no call can be made


def output_plan(request: ChatCompletionRequest) -> OutputPlan:
    """Everything checked here, before any prompt is evaluated, so bad schemas and tools are plain 400s."""
    tools = tool_spec(request)
    return OutputPlan(output_grammar(tools, content_schema(request.response_format)), tools)


def content_schema(response_format: ResponseFormat | None) -> dict[str, Any] | None:
    """The schema a plain answer must follow, if any."""
    if response_format is None or response_format.type == "text":
        return None
    given = response_format.json_schema
    schema = given.schema_ if given is not None else None
    if response_format.type == "json_object" or schema is None:
        # A json_schema format without a schema constrains no more than json_object does.
        return ANY_OBJECT
    check_schema(schema, "response_format", "response_format.json_schema.schema")
    return schema
