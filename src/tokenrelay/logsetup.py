"""Process-wide logging for `tokenrelay serve`: plain text lines, or one JSON object per line.

Records may carry structured `fields` (`log.info("request", extra={"fields": {...}})`); the text format appends
them as `key=value` pairs, the JSON format merges them into the object, so both formats say the same thing.
"""

from __future__ import annotations

import json
import logging
import re
from datetime import UTC, datetime
from typing import Any

from tokenrelay.logstream import stderr_handler
from tokenrelay.requestlog import REQUEST_LOGGER

TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
# Values needing no quotes in `key=value` text; anything else (spaces, quotes, newlines a client put in a
# model name) is written as a JSON string so one record can never look like two.
_BARE = re.compile(r'^[^\s"=\\]+$')


def record_fields(record: logging.LogRecord) -> dict[str, Any]:
    fields = getattr(record, "fields", None)
    return fields if isinstance(fields, dict) else {}


def logfmt_value(value: object) -> str:
    kind = type(value)
    if kind is int or kind is float:
        return str(value)  # digits, a sign, a point, `e`, or inf/nan: never anything to quote
    if isinstance(value, bool):
        return "true" if value else "false"
    text = value if isinstance(value, str) else json.dumps(value) if isinstance(value, list | dict) else str(value)
    return text if _BARE.match(text) else json.dumps(text, ensure_ascii=False)


def logfmt(fields: dict[str, Any]) -> str:
    """`key=value` pairs; None values are left out."""
    # A list comprehension (faster than a generator in `join`): this runs for every request's log line.
    pairs = [key + "=" + logfmt_value(value) for key, value in fields.items() if value is not None]
    return " ".join(pairs)


class TextFormatter(logging.Formatter):
    """The classic one-line format, with a record's fields appended as `key=value`."""

    def __init__(self) -> None:
        super().__init__(TEXT_FORMAT)

    def formatMessage(self, record: logging.LogRecord) -> str:
        line = super().formatMessage(record)
        pairs = logfmt(record_fields(record))
        return f"{line} {pairs}" if pairs else line


class JsonFormatter(logging.Formatter):
    """One JSON object per record: time, level, logger, message, the record's fields, any traceback."""

    def format(self, record: logging.LogRecord) -> str:
        body: dict[str, Any] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        body.update(record_fields(record))
        if record.exc_info:
            body["exc"] = self.formatException(record.exc_info)
        return json.dumps(body, ensure_ascii=False, default=str)


def configure_logging(level: str, fmt: str = "text") -> None:
    """Send every logger (ours, uvicorn's, llama.cpp's) to stderr in one format."""
    handler = stderr_handler(deferred=[REQUEST_LOGGER])
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    # Neither format shows the thread or process, so records need not look them up: a few microseconds of
    # every request's log line (the logging HOWTO's "Optimization" section).
    logging.logThreads = False
    logging.logProcesses = False
    logging.logMultiprocessing = False
    # Nor the caller's file and line (a walk up the stack per record), for the same reason.
    logging._srcfile = None
    root.setLevel(getattr(logging, level.upper(), logging.INFO))


def json_logging() -> bool:
    """Whether stderr carries JSON lines, where a terminal progress line would be noise."""
    return any(isinstance(h.formatter, JsonFormatter) for h in logging.getLogger().handlers)
