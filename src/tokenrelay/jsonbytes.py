"""JSON bodies: orjson, with the standard library for what orjson refuses or reads differently.

A streamed answer encodes and decodes one chunk per token, which orjson does many times faster than `json`.
orjson refuses integers beyond 64 bits and dict keys that are not strings, which a client's extra fields
could hold: those bodies take the standard library's path, so the output is the same compact UTF-8 JSON
either way.

`loads` gives exactly what `json.loads` gives: orjson reads integers beyond 64 bits as floats (which would
alter a node's answer), so any text with a run of 19 or more digits (the shortest integer that may not fit)
goes to the standard library, as does anything orjson rejects (`NaN`, lone surrogates, bad input: the error
is `json`'s own).
"""

from __future__ import annotations

import json
from typing import Any

import orjson

# A run of 19 digits, found as 19 zeros once every digit is written as a zero (`bytes.translate` and a
# substring search, both done in C).
_DIGITS_AS_ZEROS = bytes.maketrans(b"0123456789", b"0" * 10)
_LONG_RUN = b"0" * 19


def dumps(body: Any) -> bytes:
    try:
        return orjson.dumps(body)
    except TypeError:  # orjson.JSONEncodeError is a TypeError
        text = json.dumps(body, ensure_ascii=False, separators=(",", ":"))
    try:
        return text.encode()
    except UnicodeEncodeError:  # a lone surrogate (a node's "\ud800" escape) has no UTF-8 form: escape it again
        return json.dumps(body, separators=(",", ":")).encode()


def loads(text: str | bytes) -> Any:
    """`json.loads(text)`, faster for the usual text (see the module's note)."""
    # surrogatepass: a lone surrogate becomes bytes that orjson refuses, so `json` reads that text as before
    data = text if isinstance(text, bytes) else text.encode("utf-8", "surrogatepass")
    if _LONG_RUN not in data.translate(_DIGITS_AS_ZEROS):  # every number reads as `json` reads it
        try:
            return orjson.loads(data)
        except orjson.JSONDecodeError:
            pass
    return json.loads(text)
