"""Server-sent events from a node, decoded from raw byte chunks as they arrive.

Written here rather than taken from a library: the SSE parser we would otherwise use (`httpx-sse`) reads httpx
responses only, and our transports hand over bytes. The format is small: lines end in LF, CRLF or CR; a blank
line ends an event; `:` starts a comment (keep-alives); only `event` and `data` matter to us.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tokenrelay.jsonbytes import loads


@dataclass(slots=True)
class SSEMessage:
    """One event: its `data` as the node sent the bytes (JSON readers take bytes), its `event` name."""

    data: bytes
    event: str = ""

    def json(self) -> Any:
        """The payload read as JSON. Bytes that are not UTF-8 read as the SSE standard decodes them, with
        replacement characters (the payload is kept as bytes until here, so this costs only when needed)."""
        try:
            return loads(self.data)
        except UnicodeDecodeError:
            return loads(self.data.decode("utf-8", errors="replace"))


class SSEDecoder:
    """Feed byte chunks split anywhere (mid-line, mid-character); get back the complete events.

    Line ends are made LF as bytes arrive; the bytes after the last blank line (an event not yet ended) wait
    for the next chunk, so each event is cut out whole, once."""

    def __init__(self) -> None:
        self._pending = b""  # the events' bytes after the last blank line, line ends made LF
        self._cr = False  # the last chunk ended in CR, which may be the first half of a CRLF

    def feed(self, chunk: bytes) -> list[SSEMessage]:
        if self._cr:
            chunk = b"\r" + chunk
        self._cr = chunk.endswith(b"\r")
        if self._cr:
            chunk = chunk[:-1]
        if b"\r" in chunk:  # most nodes end lines with LF alone
            chunk = chunk.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        start = max(len(self._pending) - 1, 0)  # the pending bytes hold no blank line: search the new ones
        buffer = self._pending + chunk
        end = buffer.rfind(b"\n\n", start)
        if end < 0:
            self._pending = buffer
            return []
        self._pending = buffer[end + 2 :]
        return [message for block in buffer[:end].split(b"\n\n") if (message := _message(block)) is not None]

    def close(self) -> list[SSEMessage]:
        """The stream ended: an event the node did not finish with a blank line is still delivered.

        The SSE spec drops it, but a node that closes right after its last `data:` line meant to send it;
        a truncated one fails to parse as JSON and is reported as such.
        """
        last = _message(self._pending)
        self._pending, self._cr = b"", False
        return [last] if last is not None else []


def _message(block: bytes) -> SSEMessage | None:
    """The event of one block of lines (blank lines, before it, end no event); None if it has no data."""
    if block.startswith(b"data: ") and b"\n" not in block:  # what nodes send: one `data:` line alone
        return SSEMessage(block[6:])
    data: list[bytes] = []
    event = ""
    for line in block.split(b"\n"):
        if not line or line.startswith(b":"):  # a comment, such as a keep-alive
            continue
        name, _, value = line.partition(b":")
        value = value.removeprefix(b" ")
        if name == b"data":
            data.append(value)
        elif name == b"event":
            event = value.decode("utf-8", errors="replace")
    return SSEMessage(b"\n".join(data), event) if data else None
