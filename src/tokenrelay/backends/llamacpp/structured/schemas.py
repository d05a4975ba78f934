"""JSON Schemas → llguidance grammars, checked up front so a bad schema is a 400 and never a failed stream.

Two different complaints reach the client: a schema that is not valid JSON Schema at all (checked against its
meta-schema with `jsonschema`), and a response format using keywords the constrained decoder cannot enforce
(`uniqueItems`, `not`, `if`/`then`, unknown `format`s, look-around patterns...): llguidance refuses those
rather than ignoring them, and its message names them, so it is passed on as it is. A tool's parameters are
`lenient`: what the decoder can enforce is enforced and the rest is left to the model (agents send tool schemas
with keywords such as `propertyNames`, and a tool call is checked by the client that runs it).
"""

from __future__ import annotations

import json
from typing import Any

import jsonschema
from llguidance import LLMatcher

from tokenrelay.backends.llamacpp.structured.narrowing import generation_schema
from tokenrelay.errors import InvalidRequest

ANY_OBJECT: dict[str, Any] = {"type": "object"}
NO_ARGUMENTS: dict[str, Any] = {"type": "object", "properties": {}, "additionalProperties": False}


def check_schema(schema: dict[str, Any], param: str, what: str, *, lenient: bool = False) -> None:
    """400 unless `schema` is valid JSON Schema that the decoder can enforce (in full, unless `lenient`)."""
    try:
        jsonschema.validators.validator_for(schema).check_schema(schema)
    except jsonschema.SchemaError as exc:
        raise InvalidRequest(
            f"{what} is not a valid JSON Schema: {exc.message}", param=param, code="invalid_schema"
        ) from exc
    failed, messages = LLMatcher.validate_grammar_with_warnings(json_grammar(schema, lenient=lenient))
    if failed:
        raise InvalidRequest(
            f"{what} uses JSON Schema features the constrained decoder cannot enforce: {'; '.join(messages)}",
            param=param,
            code="unsupported_schema",
        )


def json_grammar(schema: dict[str, Any], *, lenient: bool = False) -> str:
    """An llguidance grammar for one compact JSON value matching `schema`."""
    return LLMatcher.grammar_from_json_schema(_generated(schema, lenient))


def inline_json(schema: dict[str, Any], *, lenient: bool = False) -> str:
    """The schema as a Lark `%json` sub-grammar, compact like a top-level one."""
    return f"%json {json.dumps(_generated(schema, lenient))}"


def _generated(schema: dict[str, Any], lenient: bool) -> dict[str, Any]:
    generated = generation_schema(schema)
    if lenient:  # llguidance's own option: keywords it cannot enforce are left out rather than refused
        generated["x-guidance"] = generated["x-guidance"] | {"lenient": True}
    return generated
