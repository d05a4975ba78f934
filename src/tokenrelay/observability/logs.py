"""Process-wide logging for `tokenrelay serve`: plain text lines, or one JSON object per line.

Records may carry structured `fields` (`log.info("request", extra={"fields": {...}})`); the text format appends
them as `key=value` pairs, the JSON format merges them into the object, so both formats say the same thing.
"""

from __future__ import annotations

import asyncio
import io
import json
import logging
import re
import sys
import time
from datetime import UTC, datetime
from typing import Any, TextIO

from tokenrelay.loopturn import LoopTurnBatch

REQUEST_LOGGER = "tokenrelay.requests"
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
# Values needing no quotes in `key=value` text; anything else (spaces, quotes, newlines a client put in a
# model name) is written as a JSON string so one record can never look like two.
_BARE = re.compile(r'^[^\s"=\\]+$')


def record_fields(record: logging.LogRecord) -> dict[str, Any]:
    fields = getattr(record, "fields", None)
    return fields if isinstance(fields, dict) else {}


def logfmt_value(value: object, texts: TextValues | None = None) -> str:
    kind = type(value)
    if kind is int or kind is float:
        return str(value)  # digits, a sign, a point, `e`, or inf/nan: never anything to quote
    if kind is str:
        text: str = value  # type: ignore[assignment]  # mypy narrows `type(value) is str`, not `kind is str`
        if text.isalnum():  # letters and digits alone (request ids): bare, checked in C
            return text
        return texts(text) if texts is not None else _quoted_if_needed(text)
    if isinstance(value, bool):
        return "true" if value else "false"
    return _quoted_if_needed(json.dumps(value) if isinstance(value, list | dict) else str(value))


def _quoted_if_needed(text: str) -> str:
    return text if _BARE.match(text) else json.dumps(text, ensure_ascii=False)


class TextValues:
    """How string values are written, remembered: a request line's strings are mostly the same few (model,
    endpoint, key name, node, finish reason), so each is checked against the regex once. Bounded: cleared
    when full, so clients sending endless distinct model names cannot grow it."""

    LIMIT = 4096

    def __init__(self) -> None:
        self.known: dict[str, str] = {}

    def __call__(self, text: str) -> str:
        written = self.known.get(text)
        if written is None:
            if len(self.known) >= self.LIMIT:
                self.known.clear()
            written = self.known[text] = _quoted_if_needed(text)
        return written


def logfmt(fields: dict[str, Any], texts: TextValues | None = None) -> str:
    """`key=value` pairs; None values are left out. `texts`: a memo of string values already written."""
    pairs = [key + "=" + logfmt_value(value, texts) for key, value in fields.items() if value is not None]
    return " ".join(pairs)


class TextFormatter(logging.Formatter):
    """The classic one-line format, with a record's fields appended as `key=value`."""

    default_msec_format = "%s,%03d"  # Formatter's own, declared here as the str it always is

    def __init__(self) -> None:
        super().__init__(TEXT_FORMAT)
        self._texts = TextValues()
        self._second: int | None = None  # the second whose date and time `_stamp` holds
        self._stamp = ""

    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:
        """`Formatter.formatTime`'s text, with the date and time (`strftime`) made once per second rather
        than once per record."""
        if datefmt is not None:
            return super().formatTime(record, datefmt)
        second = int(record.created)
        if second != self._second:
            self._stamp = time.strftime(self.default_time_format, self.converter(record.created))
            self._second = second
        return self.default_msec_format % (self._stamp, record.msecs)

    def formatMessage(self, record: logging.LogRecord) -> str:
        line = super().formatMessage(record)
        pairs = logfmt(record_fields(record), self._texts)
        return f"{line} {pairs}" if pairs else line


class JsonFormatter(logging.Formatter):
    """One JSON object per record: time, level, logger, message, the record's fields, any traceback."""

    def format(self, record: logging.LogRecord) -> str:
        ts = datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds")
        body: dict[str, Any] = {
            "ts": ts,
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        body.update(record_fields(record))
        if record.exc_info:
            body["exc"] = self.formatException(record.exc_info)
        return json.dumps(body, ensure_ascii=False, default=str)


class TurnBufferedHandler(logging.StreamHandler[TextIO]):
    """A stream handler whose request lines are written when the loop turn that logged them ends.

    A line per request, each its own write system call, was a tenth of a relayed request's cost; held for the
    turn, the lines of all the requests that ended in it leave in one write. Only the request logger's records
    wait; any other record (and any record from another thread, or with no loop running) is written at once,
    with whatever is held before it, so the last lines before a process ends are never left behind."""

    def __init__(self, stream: TextIO) -> None:
        super().__init__(stream)
        self._defer = False  # whether the record being emitted may wait (read under the handler's lock)
        self._turn_end = LoopTurnBatch[None](lambda _: self.write_out())

    def emit(self, record: logging.LogRecord) -> None:
        self._defer = record.name == REQUEST_LOGGER
        super().emit(record)

    def flush(self) -> None:
        """Called by `emit` after each record."""
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            self._defer = False  # another thread, or no loop: nothing will come back for the line
        if self._defer:
            self._turn_end.add(None)
        else:
            self.write_out()

    def write_out(self) -> None:
        with self.lock:  # type: ignore[union-attr]  # made by Handler.__init__
            self.stream.flush()


def stderr_stream() -> TextIO:
    """Stderr's descriptor behind a block buffer (Python's own stderr writes every line as it comes); stderr
    itself where it has no descriptor (a test harness's capture object)."""
    try:
        fd = sys.stderr.fileno()
    except (AttributeError, OSError, ValueError):
        return sys.stderr
    buffered = io.BufferedWriter(io.FileIO(fd, "w", closefd=False), 64 * 1024)
    encoding = getattr(sys.stderr, "encoding", None) or "utf-8"
    return io.TextIOWrapper(buffered, encoding=encoding, errors="backslashreplace", write_through=False)


def configure_logging(level: str, fmt: str = "text") -> None:
    """Send every logger (ours, uvicorn's, llama.cpp's) to stderr in one format."""
    handler = TurnBufferedHandler(stderr_stream())
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    # Neither format shows the thread or process, so records need not look them up (the logging HOWTO's
    # "Optimization" section).
    logging.logThreads = False
    logging.logProcesses = False
    logging.logMultiprocessing = False
    # Nor the caller's file and line (a walk up the stack per record), for the same reason.
    logging._srcfile = None
    root.setLevel(getattr(logging, level.upper(), logging.INFO))


def json_logging() -> bool:
    """Whether stderr carries JSON lines, where a terminal progress line would be noise."""
    return any(isinstance(h.formatter, JsonFormatter) for h in logging.getLogger().handlers)
