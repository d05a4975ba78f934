"""Server-sent events from a node, decoded from raw byte chunks as they arrive.

Written here rather than taken from a library: the node client is our own (see `http1.py`), and the SSE
parser we would otherwise use (`httpx-sse`) reads httpx responses only. The format is small: lines end in
LF, CRLF or CR; a blank line ends an event; `:` starts a comment (keep-alives); only `event` and `data` matter to us.
"""

from __future__ import annotations

from dataclasses import dataclass, field

_BETWEEN = b"\n\ndata: "  # the end of one data event and the start of the next
_CR, _LF = ord("\r"), ord("\n")


@dataclass(slots=True)  # not frozen: a frozen dataclass sets each field through object.__setattr__ (3x slower)
class SSEMessage:
    data: str
    event: str = ""


# What `feed` gives for each event: an `SSEMessage`, or for the usual event (one `data: ` line) its data as the
# node's bytes, with no text made first. They are not checked for numbers orjson reads otherwise than `json`
# (`jsonbytes.orjson_exact`): the reader checks what it decodes in full, and a stream's text chunks, read as
# strings between learned bytes (`chunk_template`), need no check. Bytes that are not UTF-8 are the reader's
# to judge (as `SSEMessage(data.decode("utf-8", "replace"))` is what the line-by-line reading gives).
Event = SSEMessage | bytes


@dataclass
class SSEDecoder:
    """Feed byte chunks split anywhere (mid-line, mid-character); get back the complete events."""

    _pending: bytes = b""
    _data: list[str] = field(default_factory=list)
    _event: str = ""

    def feed(self, chunk: bytes) -> list[Event]:
        buffer = self._pending + chunk
        # Byte values, not one-byte strings: `bytes in bytes` makes and drops a TypeError before it searches.
        if _CR not in buffer and not self._data and not self._event:
            return self._feed_blocks(buffer)
        return list(self._feed_lines(buffer))

    def _feed_blocks(self, buffer: bytes) -> list[Event]:
        """What nodes send: LF line ends and events of one `data: ` line, cut apart at their blank lines.

        A read of such events alone (the rule: each of its line ends is half of a `\\n\\ndata: ` between two
        events) is one split, a fifth of the cost of reading it line by line; any other event (several lines,
        comments, other fields) is read line by line within its block. What follows the last blank line is
        kept whole for the next chunk, so no partial event is held in the fields and the next feed starts clean.
        """
        end = buffer.rfind(b"\n\n")
        if end < 0:
            self._pending = buffer
            return []
        complete, pending = buffer[:end], buffer[end + 2 :]
        if complete.startswith(b"data: "):
            events = complete[6:].split(_BETWEEN)
            if complete.count(b"\n") == 2 * (len(events) - 1):  # the split's cuts hold every line end
                self._pending = pending
                return events  # type: ignore[return-value]  # list[bytes] is a list[Event]
        messages: list[Event] = []
        for block in complete.split(b"\n\n"):
            if block.startswith(b"data: ") and _LF not in block:
                messages.append(block[6:])
                continue
            messages.extend(self._feed_lines(block + b"\n\n"))  # a whole block: leaves nothing pending
        self._pending = pending
        return messages

    def _feed_lines(self, buffer: bytes) -> list[SSEMessage]:
        # A CR at the very end may be the first half of a CRLF: keep it until the next chunk says.
        cut = len(buffer) - 1 if buffer.endswith(b"\r") else len(buffer)
        lines = buffer[:cut].replace(b"\r\n", b"\n").replace(b"\r", b"\n").split(b"\n")
        self._pending = lines.pop() + buffer[cut:]
        messages = []
        for line in lines:
            message = self._line(line.decode("utf-8", errors="replace"))
            if message is not None:
                messages.append(message)
        return messages

    def _line(self, line: str) -> SSEMessage | None:
        if not line:
            return self._dispatch()
        if line.startswith(":"):
            return None
        name, _, value = line.partition(":")
        value = value.removeprefix(" ")
        if name == "data":
            self._data.append(value)
        elif name == "event":
            self._event = value
        return None

    def _dispatch(self) -> SSEMessage | None:
        if not self._data:
            self._event = ""
            return None
        message = SSEMessage("\n".join(self._data), self._event)
        self._data, self._event = [], ""
        return message

    def close(self) -> list[SSEMessage]:
        """The stream ended: an event the node did not finish with a blank line is still delivered.

        The SSE spec drops it, but a node that closes right after its last `data:` line meant to send it;
        a truncated one fails to parse as JSON and is reported as such.
        """
        tail = self._feed_lines(self._pending + b"\n") if self._pending else []
        last = self._dispatch()
        return [*tail, last] if last is not None else tail
