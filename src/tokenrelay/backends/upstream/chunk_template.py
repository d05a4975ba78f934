"""A node's plain stream chunks read by their bytes: the chunk around the text, learned from one of them.

Most of a stream is chunks that differ only in their text: `{"id": ..., "choices": [{"index": 0, "delta":
{"content": "` text `"}, "logprobs": null, "finish_reason": null}]}`. Decoding each in full and checking its
shape (`wire.plain_delta`) cost about 1.2 us a chunk here; a chunk that starts and ends with the bytes the
learned one had around its text, with a single JSON string between, costs a third of that: two byte
comparisons in C and the decoding of the string alone.

What is learned is proven before it is used. From a chunk decoded in full whose one choice carries text alone,
the text's JSON form (as orjson writes it) must occur exactly once in the chunk's bytes; the bytes before and
after it are then put around a probe text and decoded in full, and only if that reads as the same plain chunk
with the probe as its text are they kept. A JSON string can stand in for another anywhere without changing
how the rest of the document parses, so every later chunk made of those bytes around one string (which
`orjson.loads` of the middle alone confirms: one string and nothing else) is that plain chunk with that text.
Anything else (another shape, a node whose chunks change their id or time, text it escapes otherwise) is
decoded in full, as before; learning stops after a few tries.

The learned chunks of one read are proven together (`run`): their middles joined into one JSON array, with a
line feed before each comma, must decode to as many strings as there are middles. A raw line feed cannot be
inside a JSON string, so no string spans two middles; no other top-level value may span one either (it would
not be a string); so every one of those commas separates the array's elements, and since a slot between two
commas holds at least one value, a count equal to the middles' leaves exactly one string in each. One orjson
call for the run instead of one per chunk, and each middle is then also the proven JSON form of its text, which
the renderer copies into the client's chunk as it is (`TextRun.encoded`) rather than encoding it again.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import orjson

PlainText = Callable[[dict[str, Any]], "tuple[int, str] | None"]  # `wire.plain_delta`

_PROBE = "\x00tokenrelay:probe\x00"  # a text no node sends
_PROBE_JSON = orjson.dumps(_PROBE)
_TRIES = 3  # chunks with text examined before giving up on a node's stream


class ChunkTemplate:
    """The learned bytes of one stream's plain chunks (one per exchange: chunks of another stream differ)."""

    __slots__ = ("_plain", "_tries", "head", "index", "tail")

    def __init__(self, plain: PlainText) -> None:
        self._plain = plain
        self._tries = _TRIES
        self.head: bytes | None = None  # what precedes the text's JSON string; None until learned
        self.tail = b""
        self.index = 0

    def text(self, data: bytes) -> str | None:
        """The text of `data` if it is the learned chunk around another string; None if it is not."""
        head, tail = self.head, self.tail
        if head is None or not data.startswith(head) or not data.endswith(tail):
            return None  # (a chunk shorter than both, which they overlap in, leaves no string between: refused below)
        try:
            text = orjson.loads(data[len(head) : len(data) - len(tail)])
        except orjson.JSONDecodeError:
            return None
        return text if type(text) is str else None

    def run(self, chunks: list[bytes]) -> tuple[list[str], list[bytes]] | None:
        """The texts of `chunks`, learned chunks all (`head` and `tail` at their ends, longer than both), with
        their JSON strings as sent; None unless every middle is one JSON string (see the module's docstring).
        Empty texts are left out, as `text`'s reader leaves them."""
        start, tail = len(self.head or b""), len(self.tail)
        middles = [data[start : len(data) - tail] for data in chunks]
        try:
            texts = orjson.loads(b"[" + b"\n,".join(middles) + b"]")
        except orjson.JSONDecodeError:
            return None
        if len(texts) != len(middles) or set(map(type, texts)) != {str}:
            return None
        if "" in texts:
            kept = [(text, middle) for text, middle in zip(texts, middles, strict=True) if text]
            return [text for text, _ in kept], [middle for _, middle in kept]
        return texts, middles

    @property
    def learning(self) -> bool:
        return self.head is None and self._tries > 0

    def learn(self, data: bytes, chunk: dict[str, Any]) -> None:
        """Learn from `data`, a chunk that `chunk` is the full decoding of (any chunk may be offered)."""
        plain = self._plain(chunk)
        if plain is None or not plain[1]:
            return
        self._tries -= 1
        index, text = plain
        encoded = orjson.dumps(text)
        if data.count(encoded) != 1:
            return
        head, tail = data.split(encoded)
        try:
            probe = orjson.loads(head + _PROBE_JSON + tail)
        except orjson.JSONDecodeError:
            return
        if (
            type(probe) is dict
            and "usage" not in probe
            and "error" not in probe
            and self._plain(probe) == (index, _PROBE)
        ):
            self.head, self.tail, self.index = head, tail, index
