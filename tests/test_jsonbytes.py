"""The hot path's JSON encoder writes what the standard library writes, compactly, for any body."""

from __future__ import annotations

import json

import pytest

from tokenrelay.jsonbytes import dumps


@pytest.mark.parametrize(
    "body",
    [
        {"content": "Héllo wörld ✓ \u2028", "n": 3, "x": None, "f": 0.25, "nested": [{"a": True}]},
        {"seed": 2**70},  # beyond 64 bits: orjson refuses, the standard library writes it exactly
        {1: "a non-string key"},
    ],
)
def test_same_compact_utf8_json_as_the_standard_library(body: dict) -> None:
    assert dumps(body) == json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode()
