"""The embedding request's validation: every bad `input` and unknown field is a 400 naming it."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tokenrelay.api.parsing import validate_json
from tokenrelay.errors import InvalidRequest
from tokenrelay.protocol.embeddings import MAX_INPUTS, EmbeddingRequest


def parse(**fields: Any) -> EmbeddingRequest:
    return validate_json(EmbeddingRequest, json.dumps({"model": "m", **fields}).encode())


def refusal(**fields: Any) -> InvalidRequest:
    with pytest.raises(InvalidRequest) as caught:
        parse(**fields)
    assert caught.value.status == 400
    return caught.value


@pytest.mark.parametrize(
    ("value", "inputs"),
    [
        ("one text", ["one text"]),
        (["a", "b"], ["a", "b"]),
        ([1, 2, 3], [[1, 2, 3]]),
        ([[1, 2], [3]], [[1, 2], [3]]),
    ],
)
def test_each_input_shape_gives_one_entry_per_embedding(value: Any, inputs: list[Any]) -> None:
    assert parse(input=value).inputs == inputs


@pytest.mark.parametrize("value", [[], "", ["a", ""], [[1], []], [-1, 2], [[0], [-5]], 3, [1.5], ["a", 1], None])
def test_bad_inputs_are_400s_naming_input(value: Any) -> None:
    error = refusal(input=value)
    assert error.param is not None and error.param.split(".")[0] == "input"


def test_too_many_inputs_is_refused_but_a_long_token_list_is_one_input() -> None:
    assert refusal(input=["x"] * (MAX_INPUTS + 1)).param == "input"
    assert len(parse(input=[7] * (MAX_INPUTS + 1)).inputs) == 1


def test_missing_input_is_named() -> None:
    assert refusal().param == "input"


def test_unknown_fields_are_refused_by_name() -> None:
    error = refusal(input="x", dimension=8, encoding="float")
    assert error.param == "dimension"
    assert "`dimension`" in error.message and "`encoding`" in error.message


@pytest.mark.parametrize(("field", "value"), [("encoding_format", "hex"), ("dimensions", 0), ("dimensions", "8")])
def test_bad_options_name_their_field(field: str, value: Any) -> None:
    assert refusal(input="x", **{field: value}).param == field


def test_options_are_read() -> None:
    body = parse(input="x", encoding_format="base64", dimensions=4, user="u-1")
    assert body.base64 and body.dimensions == 4 and body.user == "u-1"
    assert not parse(input="x", encoding_format="float").base64
