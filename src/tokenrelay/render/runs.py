"""A `TextRun` as SSE frames: each text's chunk is the chunk of a lone `TextDelta`, filled in as bytes.

A streamed chunk that carries only text differs from the next only in that text. So the chunk of one choice
is rendered once, with a placeholder for the text, and cut around it; each text of a run is then its JSON
string between the two halves, with no dict built or encoded per chunk. The halves come from the chunker's
own rendering, so the bytes are those the chunker would have written for each text alone. A run read from a
node with its texts' JSON strings (`TextRun.encoded`) is written with those strings, the same texts in the
node's escaping (either is valid JSON for them): no text is encoded again.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import orjson

from tokenrelay.backends.base import Event, TextDelta, TextRun
from tokenrelay.sse import frame

# A text no client or node sends (NULs around a name); its JSON form is looked for exactly once in the chunk.
_PLACEHOLDER = "\x00tokenrelay:text\x00"
_MARKER = orjson.dumps(_PLACEHOLDER)

Render = Callable[[Event], "dict[str, Any] | None"]


class RunFrames:
    """The frames of the runs of one response, from the chunker's `event` rendering."""

    def __init__(self, render: Render) -> None:
        self.render = render
        self._templates: dict[int, tuple[bytes, bytes] | None] = {}  # by choice index

    def piece(self, event: Event) -> dict[str, Any] | bytes | None:
        """What one event becomes in the stream: the frames of a run, else the chunker's own rendering."""
        return self.frames(event) if type(event) is TextRun else self.render(event)

    def frames(self, run: TextRun) -> bytes:
        template = self._template(run.index)
        if template is not None:
            before, after = template
            if run.encoded is not None:  # the node's own JSON strings, proven (`TextRun`): nothing to encode
                return before + (after + before).join(run.encoded) + after
            try:
                return b"".join([before + orjson.dumps(text) + after for text in run.texts])
            except TypeError:  # a text orjson refuses (a lone surrogate): encoded chunk by chunk, as before
                pass
        return b"".join(self._one(run.index, text) for text in run.texts)

    def _one(self, index: int, text: str) -> bytes:
        body = self.render(TextDelta(index, text))
        return frame(body) if body is not None else b""

    def _template(self, index: int) -> tuple[bytes, bytes] | None:
        if index not in self._templates:
            encoded = self._one(index, _PLACEHOLDER)
            found = encoded.count(_MARKER) == 1
            before, _, after = encoded.partition(_MARKER)
            self._templates[index] = (before, after) if found else None
        return self._templates[index]
