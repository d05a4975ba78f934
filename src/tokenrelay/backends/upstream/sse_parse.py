"""Server-sent events from a node, decoded from raw byte chunks as they arrive.

Written here rather than taken from a library: the node client is our own (see `http1.py`), and the SSE
parser we would otherwise use (`httpx-sse`) reads httpx responses only. The format is small: lines end in
LF, CRLF or CR; a blank line ends an event; `:` starts a comment (keep-alives); only `event` and `data` matter to us.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class SSEMessage:
    data: str
    event: str = ""


@dataclass
class SSEDecoder:
    """Feed byte chunks split anywhere (mid-line, mid-character); get back the complete events."""

    _pending: bytes = b""
    _data: list[str] = field(default_factory=list)
    _event: str = ""

    def feed(self, chunk: bytes) -> list[SSEMessage]:
        buffer = self._pending + chunk
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
        tail = self.feed(b"\n") if self._pending else []
        last = self._dispatch()
        return [*tail, last] if last is not None else tail
