"""The request log line: one record per finished call, in either log format, for any handler set-up."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator

import pytest

from tokenrelay.backends.base import Usage
from tokenrelay.calls.record import Call
from tokenrelay.observability.logs import JsonFormatter, TextFormatter
from tokenrelay.observability.requestlog import REQUEST_LOGGER, call_fields, log_call


def finished_call() -> Call:
    call = Call(request_id="0192f0a0b1c2d3e4f5a6b7c8d9e0f1a2", endpoint="chat.completions", model='odd "model"')
    call.backend, call.node, call.key_name, call.usage = "upstream", "gpu-1", "ci bot", Usage(12, 7, 3)
    call.finish_reasons, call.first_token_at, call.ended = ["stop"], call.started + 0.0123, call.started + 0.5
    return call


@pytest.fixture
def stream() -> Iterator[io.StringIO]:
    """A string buffer for the root handler `use` installs; the root logger is restored afterwards."""
    root = logging.getLogger()
    saved = root.handlers[:], root.level
    yield io.StringIO()
    root.handlers[:], root.level = saved[0], saved[1]


def use(out: io.StringIO, formatter: logging.Formatter) -> None:
    """The root logger as `configure_logging` leaves it. Called in the test itself: pytest adds its own
    capture handlers to the root when a test's body starts, after the fixtures."""
    handler = logging.StreamHandler(out)
    handler.setFormatter(formatter)
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(logging.INFO)


def test_text_line(stream: io.StringIO) -> None:
    use(stream, TextFormatter())
    log_call(finished_call(), worker=4242)
    (line,) = stream.getvalue().splitlines()
    stamp = len("2026-01-01 12:00:00,000")
    assert line[stamp:].startswith(" INFO tokenrelay.requests: request request_id=0192f0a0")
    assert 'model="odd \\"model\\"" backend=upstream node=gpu-1' in line and 'key="ci bot"' in line
    assert line.endswith(" worker=4242")


def test_json_line_carries_every_field(stream: io.StringIO) -> None:
    use(stream, JsonFormatter())
    call = finished_call()
    log_call(call, worker=4242)
    (line,) = (json.loads(text) for text in stream.getvalue().splitlines())
    assert line.pop("ts").endswith("+00:00")
    assert line == {"level": "info", "logger": REQUEST_LOGGER, "msg": "request"} | call_fields(call) | {"worker": 4242}
    assert line["ttft_ms"] == 12.3 and line["usage_estimated"] is None


def test_handlers_and_filters_of_the_request_logger_see_its_records(stream: io.StringIO) -> None:
    use(stream, TextFormatter())
    seen: list[logging.LogRecord] = []

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            seen.append(record)

    requests = logging.getLogger(REQUEST_LOGGER)
    requests.addHandler(collector := Collect())
    try:
        log_call(finished_call())
    finally:
        requests.removeHandler(collector)
    assert len(seen) == 1 and seen[0].fields["node"] == "gpu-1"  # type: ignore[attr-defined]
    assert len(stream.getvalue().splitlines()) == 1  # and it still propagated to the root's handler

    dropping = logging.Filter("nothing.matches")
    requests.addFilter(dropping)
    try:
        log_call(finished_call())
    finally:
        requests.removeFilter(dropping)
    assert len(stream.getvalue().splitlines()) == 1  # the filter was honoured: no line


def test_nothing_is_written_below_the_level(stream: io.StringIO) -> None:
    use(stream, TextFormatter())
    logging.getLogger().setLevel(logging.WARNING)
    log_call(finished_call())
    assert stream.getvalue() == ""
