"""The JSON encoder and decoder give what the standard library gives, compactly, for any body."""

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


@pytest.mark.parametrize(
    "text",
    [
        '{"choices":[{"index":0,"delta":{"content":"Héllo ✓"},"finish_reason":null}],"created":1700000000}',
        '{"seed": 18446744073709551616, "small": 9223372036854775807}',  # past 64 bits: an exact integer still
        '{"neg": -9223372036854775809}',  # 19 digits that fit no 64-bit integer
        '{"x": 100000000000000000000000000000, "y": 0.1234567890123456789012}',
        '{"f": [1.0, 1E2, -0.0, 0.30000000000000004, 1e400, 1e-400]}',
        '{"odd": NaN, "inf": -Infinity}',  # not JSON, but what `json.loads` accepts
        '["\\ud800 a lone surrogate"]',
        '{"a": 1, "a": 2}',
        '  {"padded": true}  ',
    ],
)
def test_loads_reads_what_the_standard_library_reads(text: str) -> None:
    from tokenrelay.jsonbytes import loads

    expected = json.loads(text)
    for given in (text, text.encode()):
        got = loads(given)
        assert repr(got) == repr(expected)  # repr: NaN compares unequal to itself, and int vs float shows


@pytest.mark.parametrize("text", ['{"a": ', "not json", '{"a": 1}}', ""])
def test_loads_refuses_what_the_standard_library_refuses(text: str) -> None:
    from tokenrelay.jsonbytes import loads

    with pytest.raises(json.JSONDecodeError):
        loads(text)


def test_loads_reads_a_raw_lone_surrogate_as_the_standard_library_does() -> None:
    from tokenrelay.jsonbytes import loads

    text = '{"content": "raw \ud800 surrogate", "n": 1}'  # a str only: it has no UTF-8 encoding
    assert repr(loads(text)) == repr(json.loads(text))


@pytest.mark.parametrize("digits", [18, 19, 25])
def test_loads_keeps_integers_exact_around_the_19_digit_threshold(digits: int) -> None:
    from tokenrelay.jsonbytes import loads

    text = f'{{"a": {"9" * digits}, "b": "1234567890-1234567890", "c": {"1" * digits}.5}}'
    assert repr(loads(text)) == repr(json.loads(text))


def test_a_lone_surrogate_is_written_escaped_as_valid_utf8() -> None:
    body = {"content": "a \ud800 b", "ok": "✓"}  # what json.loads makes of a node's "\\ud800"
    encoded = dumps(body)
    assert encoded.decode("utf-8") == '{"content":"a \\ud800 b","ok":"\\u2713"}'
    assert json.loads(encoded) == body
