"""A stderr log handler that writes the records of one event-loop turn together.

Python's stderr is line-buffered and `StreamHandler` flushes after every record, so each log line was its
own `write` system call: the per-request line cost about a tenth of a relayed request's CPU under load (the
gateway benchmark at concurrency 64). Here records go into a private block buffer over the same file
descriptor, and the event loop thread flushes it once at the end of the loop turn that wrote them
(`call_soon`): a line reaches the file within the turn, never later, and the lines of all the requests
that finished in one turn leave in one write. Records from other threads (the engine's, a database
driver's) and from code running outside any loop flush at once, as `StreamHandler` does.
"""

from __future__ import annotations

import asyncio
import io
import logging
import sys
from typing import TextIO

_BUFFER_BYTES = 64 * 1024


class LoopTurnHandler(logging.StreamHandler):  # type: ignore[type-arg]
    def __init__(self, stream: TextIO) -> None:
        super().__init__(stream)
        self._flush_pending = False

    def flush(self) -> None:
        """Called by `emit` after each record: on the loop's thread, deferred to the end of the turn."""
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # another thread, or no loop at all: write now
            self.flush_now()
            return
        if not self._flush_pending:
            self._flush_pending = True
            loop.call_soon(self.flush_now)

    def flush_now(self) -> None:
        with self.lock:  # type: ignore[union-attr]  # created by Handler.__init__
            self._flush_pending = False
            if self.stream and hasattr(self.stream, "flush"):
                self.stream.flush()


def stderr_handler() -> logging.StreamHandler:  # type: ignore[type-arg]
    """A `LoopTurnHandler` over stderr's file descriptor; a plain `StreamHandler` when stderr has none (a
    test harness's capture object), since there is no descriptor to buffer for."""
    try:
        fd = sys.stderr.fileno()
    except (AttributeError, OSError, ValueError):
        return logging.StreamHandler(sys.stderr)
    encoding = getattr(sys.stderr, "encoding", None) or "utf-8"
    raw = io.FileIO(fd, "w", closefd=False)
    stream = io.TextIOWrapper(
        io.BufferedWriter(raw, _BUFFER_BYTES), encoding=encoding, errors="backslashreplace", write_through=False
    )
    return LoopTurnHandler(stream)


def flush_log_handlers() -> None:
    """Write out every deferred record now (at shutdown: a worker process may end without running the loop
    again, or without `logging.shutdown`)."""
    for handler in logging.getLogger().handlers:
        if isinstance(handler, LoopTurnHandler):
            handler.flush_now()
