"""Schemas as generated (narrowed, still valid) and the up-front checks, without a model."""

from __future__ import annotations

import jsonschema
import pytest
from llguidance import LLMatcher

from tokenrelay.backends.llamacpp.structured.grammars import output_grammar
from tokenrelay.backends.llamacpp.structured.narrowing import generation_schema
from tokenrelay.backends.llamacpp.structured.schemas import check_schema, json_grammar
from tokenrelay.backends.llamacpp.structured.toolspec import ToolSpec, tool_spec
from tokenrelay.errors import InvalidRequest
from tokenrelay.protocol.chat import ChatCompletionRequest, FunctionDef

OPEN = {
    "type": "object",
    "properties": {
        "n": {"type": "integer"},
        "x": {"type": ["number", "null"]},
        "inner": {"type": "object", "properties": {"a": {"type": "string"}}},
        "free": {"type": "object", "properties": {"a": {"type": "string"}}, "additionalProperties": True},
    },
    "required": ["n"],
}


def test_declared_objects_are_closed_and_numbers_bounded() -> None:
    narrowed = generation_schema(OPEN)
    assert narrowed["additionalProperties"] is False
    assert narrowed["properties"]["inner"]["additionalProperties"] is False
    assert narrowed["properties"]["free"]["additionalProperties"] is True
    assert narrowed["properties"]["n"]["maximum"] == 2**53 - 1 and "multipleOf" not in narrowed["properties"]["n"]
    assert narrowed["properties"]["x"]["multipleOf"] == 1e-10
    assert narrowed["x-guidance"]["whitespace_flexible"] is False
    assert OPEN.get("additionalProperties") is None  # the request's own schema is untouched


def test_combined_objects_stay_open() -> None:
    schema = {"allOf": [{"type": "object", "properties": {"a": {"type": "integer"}}}], "properties": {"b": {}}}
    narrowed = generation_schema(schema)
    assert "additionalProperties" not in narrowed and "additionalProperties" not in narrowed["allOf"][0]
    assert narrowed["allOf"][0]["properties"]["a"] == {"type": "integer"}  # nothing under allOf is changed


def test_schema_layout_options_win_over_compact() -> None:
    narrowed = generation_schema({"type": "object", "x-guidance": {"whitespace_flexible": True}})
    assert narrowed["x-guidance"]["whitespace_flexible"] is True


def test_an_object_requiring_undeclared_properties_stays_open() -> None:
    narrowed = generation_schema({"type": "object", "properties": {"a": {}}, "required": ["a", "b"]})
    assert "additionalProperties" not in narrowed


@pytest.mark.parametrize(
    ("schema", "code", "named"),
    [
        ({"type": "strng"}, "invalid_schema", "not a valid JSON Schema"),
        ({"minItems": -1}, "invalid_schema", "-1"),
        ({"type": "array", "uniqueItems": True}, "unsupported_schema", "uniqueItems"),
        ({"type": "object", "propertyNames": {"maxLength": 3}}, "unsupported_schema", "propertyNames"),
        ({"type": "string", "pattern": "(?<=a)b"}, "unsupported_schema", "look-around"),
    ],
)
def test_check_schema_names_the_problem(schema: dict, code: str, named: str) -> None:
    with pytest.raises(InvalidRequest) as info:
        check_schema(schema, "response_format", "the schema")
    assert info.value.code == code and info.value.param == "response_format"
    assert named in info.value.message


def test_supported_schemas_pass_and_compile() -> None:
    check_schema(OPEN, "response_format", "the schema")
    assert not LLMatcher.validate_grammar_with_warnings(json_grammar(OPEN))[0]
    jsonschema.validate({"n": 1, "x": None, "inner": {"a": "b"}}, generation_schema(OPEN))


def test_output_grammar_kinds() -> None:
    functions = (FunctionDef(name="f", parameters={"type": "object"}), FunctionDef(name="g"))
    assert output_grammar(None, None) is None
    for spec in (
        ToolSpec(functions, "auto", parallel=True),
        ToolSpec(functions, "required", parallel=False),
        ToolSpec(functions, "g", parallel=False),
    ):
        for content in (None, {"type": "object"}):
            assert output_grammar(spec, content)


def test_default_bounds_never_make_a_schema_unsatisfiable() -> None:
    for schema in ({"type": "number", "enum": [1e300, 2.5]}, {"type": "integer", "const": 2**60}):
        narrowed = generation_schema(schema)
        assert "minimum" not in narrowed and "maximum" not in narrowed and "multipleOf" not in narrowed
        assert not LLMatcher.validate_grammar_with_warnings(json_grammar(schema))[0]
    below = generation_schema({"type": "integer", "maximum": -(2**60)})
    assert "minimum" not in below  # a default minimum above the schema's maximum would allow nothing
    above = generation_schema({"type": "number", "exclusiveMinimum": 1e20})
    assert "maximum" not in above and above["multipleOf"] == 1e-10


def test_a_tools_parameters_are_enforced_as_far_as_the_decoder_can_and_never_refused_for_the_rest() -> None:
    """Claude Code's task tools use `propertyNames`: the arguments are still JSON objects of the declared shape."""
    schema = {
        "type": "object",
        "properties": {"metadata": {"type": "object", "propertyNames": {"pattern": "^[a-z]+$"}}},
        "required": ["metadata"],
    }
    task = {"type": "function", "function": {"name": "task", "parameters": schema}}
    body = {"model": "m", "messages": [{"role": "user", "content": "x"}], "tools": [task]}
    request = ChatCompletionRequest.model_validate(body)
    spec = tool_spec(request)
    assert spec is not None and not LLMatcher.validate_grammar_with_warnings(output_grammar(spec, None) or "")[0]
    with pytest.raises(InvalidRequest):  # the same keyword in a response format is refused: the answer is the JSON
        check_schema(schema, "response_format", "the schema")
