"""How deep a body may nest: checked before any JSON parser reads it, brackets inside strings not counted."""

from __future__ import annotations

import json

import pytest

from tokenrelay.api.parsing import MAX_DEPTH, check_depth, validate_json
from tokenrelay.errors import InvalidRequest
from tokenrelay.protocol.chat import ChatCompletionRequest


def nested(depth: int) -> bytes:
    return b'{"x": ' + b"[" * (depth - 1) + b"]" * (depth - 1) + b"}"


def test_a_body_at_the_limit_passes_and_one_level_more_does_not() -> None:
    check_depth(nested(MAX_DEPTH))
    with pytest.raises(InvalidRequest) as deeper:
        check_depth(nested(MAX_DEPTH + 1))
    assert (deeper.value.status, deeper.value.code) == (400, "invalid_json")


def test_brackets_in_strings_do_not_count() -> None:
    text = '"[{' * 200 + '\\\\"'
    body = json.dumps({"messages": [{"role": "user", "content": text, "name": "[[[\\"}]}).encode()
    check_depth(body)


def test_many_brackets_side_by_side_are_shallow() -> None:
    check_depth(json.dumps({"x": [[1, [2]] for _ in range(10_000)]}).encode())


@pytest.mark.parametrize("depth", [MAX_DEPTH + 1, 1_000, 200_000])
def test_validation_refuses_deep_bodies_with_a_400(depth: int) -> None:
    with pytest.raises(InvalidRequest) as refused:
        validate_json(ChatCompletionRequest, nested(depth))
    assert refused.value.status == 400
