"""Token bytes → text deltas, with stop strings caught even when split across tokens.

Text that could still turn into a stop string is held back, so a stop never leaks into a stream; logprob
entries travel with the text they produced, so logprobs and text stay aligned after a stop cuts the output.
"""

from __future__ import annotations

import codecs
from dataclasses import dataclass, field, replace

from tokenrelay.backends.base import TokenLogprob


def partial_match(text: str, needles: list[str]) -> int:
    """Length of the longest tail of `text` that begins one of `needles` (text that must be held back)."""
    best = 0
    for needle in needles:
        for size in range(min(len(needle) - 1, len(text)), best, -1):
            if text.endswith(needle[:size]):
                best = size
                break
    return best


@dataclass(slots=True)
class Released:
    text: str = ""
    logprobs: list[TokenLogprob] = field(default_factory=list)
    stopped: bool = False
    stop: str | None = None  # the stop string that ended the text, when `stopped`


class TextStream:
    """One sequence's output text, released as soon as no stop string can still match it."""

    def __init__(self, stops: list[str], offset: int = 0) -> None:
        self._stops = stops
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._released = offset  # characters already released (text_offset of the next character)
        self._pending = ""
        self._entries: list[TokenLogprob] = []

    def feed(self, piece: bytes, entry: TokenLogprob | None = None) -> Released:
        if entry is not None:
            self._entries.append(replace(entry, text_offset=self._released + len(self._pending)))
        self._pending += self._decoder.decode(piece)
        found = self._first_stop()
        if found is not None:
            cut, stop = found
            out = self._release(cut)
            out.stopped, out.stop = True, stop
            self._pending = ""
            return out
        return self._release(len(self._pending) - self._held_back())

    def flush(self) -> Released:
        """Release everything (generation ended for a reason other than a stop string)."""
        self._pending += self._decoder.decode(b"", final=True)
        return self._release(len(self._pending))

    def _first_stop(self) -> tuple[int, str] | None:
        """Where the earliest stop string starts, and which it is (the first listed, when two start there)."""
        found = [(i, n) for n, i in enumerate(self._pending.find(s) for s in self._stops) if i >= 0]
        if not found:
            return None
        cut, number = min(found)
        return cut, self._stops[number]

    def _held_back(self) -> int:
        return partial_match(self._pending, self._stops)

    def _release(self, upto: int) -> Released:
        text, self._pending = self._pending[:upto], self._pending[upto:]
        boundary = self._released + len(text)
        # A token goes out with the delta that releases its first character; when nothing is held back,
        # tokens that produced no text yet (a partial UTF-8 character) go out too.
        if self._pending:
            count = sum(1 for e in self._entries if e.text_offset < boundary)
        else:
            count = len(self._entries)
        ready, self._entries = self._entries[:count], self._entries[count:]
        self._released = boundary
        return Released(text=text, logprobs=ready)
