"""A stderr log handler that writes the records of one event-loop turn together.

Python's stderr is line-buffered and `StreamHandler` flushes after every record, so each log line was its
own `write` system call: the per-request line cost about a tenth of a relayed request's CPU under load (the
gateway benchmark at concurrency 64). Here records go into a private block buffer over the same file
descriptor, and the event loop thread flushes it once at the end of the loop turn that wrote them
(`call_soon`): a line reaches the file within the turn, never later, and the lines of all the requests
that finished in one turn leave in one write. Records from other threads (the engine's, a database
driver's) and from code running outside any loop flush at once, as `StreamHandler` does.

Only the loggers named as `deferred` (the per-request log) wait for the end of the turn; every other record
is written at once, with whatever request lines are held before it. A process can end inside a loop turn,
with no later turn and no exit handlers: uvicorn re-raises SIGTERM once its graceful shutdown is done, and
the default action kills the process there. uvicorn's own closing lines ("Application shutdown complete",
"Finished server process") come after the last request and are written at once, so they take every request
line with them.
"""

from __future__ import annotations

import asyncio
import io
import logging
import sys
from collections.abc import Collection
from typing import TextIO

_BUFFER_BYTES = 64 * 1024


class LoopTurnHandler(logging.StreamHandler):  # type: ignore[type-arg]
    def __init__(self, stream: TextIO, deferred: Collection[str] = ()) -> None:
        """`deferred`: the names of the loggers whose records may wait for the end of the loop turn."""
        super().__init__(stream)
        self.deferred = frozenset(deferred)
        self._defer = False  # whether the record being emitted may wait (set and read under the handler's lock)
        self._flush_pending = False

    def emit(self, record: logging.LogRecord) -> None:
        self._defer = record.name in self.deferred
        super().emit(record)

    def write_deferred(self, line: str) -> None:
        """A line already formatted for a deferred logger (`tokenrelay.requestlog`'s direct path): written
        as `emit` writes a record's, and flushed at the end of the loop turn like one."""
        with self.lock:  # type: ignore[union-attr]  # created by Handler.__init__
            self.stream.write(line + self.terminator)
            self._defer = True
            self.flush()

    def flush(self) -> None:
        """Called by `emit` after each record: a deferred logger's record on the loop's thread waits for the end
        of the turn; anything else is written at once, with what is held before it."""
        if not self._defer:
            self.flush_now()
            return
        self._defer = False
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


def stderr_handler(deferred: Collection[str]) -> logging.StreamHandler:  # type: ignore[type-arg]
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
    return LoopTurnHandler(stream, deferred)


def flush_log_handlers() -> None:
    """Write out every deferred record now (at shutdown: a worker process may end without running the loop
    again, or without `logging.shutdown`)."""
    for handler in logging.getLogger().handlers:
        if isinstance(handler, LoopTurnHandler):
            handler.flush_now()
