"""Server-sent events from a node, decoded from raw byte chunks as they arrive.

Written here rather than taken from a library: the SSE parser we would otherwise use (`httpx-sse`) reads httpx
responses only, and our transports hand over bytes. The format is small: lines end in LF, CRLF or CR; a blank
line ends an event; `:` starts a comment (keep-alives); only `event` and `data` matter to us.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True)
class SSEMessage:
    data: str
    event: str = ""


class SSEDecoder:
    """Feed byte chunks split anywhere (mid-line, mid-character); get back the complete events.

    Line ends are made LF as bytes arrive; the bytes after the last blank line (an event not yet ended) wait
    for the next chunk, so each event is decoded whole, once, and no character is cut in two."""

    def __init__(self) -> None:
        self._pending = b""  # the events' bytes after the last blank line, line ends made LF
        self._cr = False  # the last chunk ended in CR, which may be the first half of a CRLF

    def feed(self, chunk: bytes) -> list[SSEMessage]:
        if self._cr:
            chunk = b"\r" + chunk
        self._cr = chunk.endswith(b"\r")
        if self._cr:
            chunk = chunk[:-1]
        start = max(len(self._pending) - 1, 0)  # the pending bytes hold no blank line: search the new ones
        buffer = self._pending + chunk.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        end = buffer.rfind(b"\n\n", start)
        if end < 0:
            self._pending = buffer
            return []
        self._pending = buffer[end + 2 :]
        events = buffer[:end].decode("utf-8", errors="replace").split("\n\n")
        return [message for block in events if (message := _message(block)) is not None]

    def close(self) -> list[SSEMessage]:
        """The stream ended: an event the node did not finish with a blank line is still delivered.

        The SSE spec drops it, but a node that closes right after its last `data:` line meant to send it;
        a truncated one fails to parse as JSON and is reported as such.
        """
        last = _message(self._pending.decode("utf-8", errors="replace"))
        self._pending, self._cr = b"", False
        return [last] if last is not None else []


def _message(block: str) -> SSEMessage | None:
    """The event of one block of lines (blank lines, before it, end no event); None if it has no data."""
    if block.startswith("data: ") and "\n" not in block:  # what nodes send: one `data:` line alone
        return SSEMessage(block[6:])
    data: list[str] = []
    event = ""
    for line in block.split("\n"):
        if not line or line.startswith(":"):  # a comment, such as a keep-alive
            continue
        name, _, value = line.partition(":")
        value = value.removeprefix(" ")
        if name == "data":
            data.append(value)
        elif name == "event":
            event = value
    return SSEMessage("\n".join(data), event) if data else None
