"""The request log line: written directly when logging is tokenrelay's own set-up, the same text either way."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator

import pytest

from tokenrelay.backends.base import Usage
from tokenrelay.calls import Call
from tokenrelay.logsetup import JsonFormatter, TextFormatter
from tokenrelay.logstream import LoopTurnHandler
from tokenrelay.requestlog import REQUEST_LOGGER, call_fields, log_call


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
    handler = LoopTurnHandler(out, deferred=[REQUEST_LOGGER])
    handler.setFormatter(formatter)
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(logging.INFO)


def both_ways(out: io.StringIO, call: Call, monkeypatch: pytest.MonkeyPatch) -> tuple[str, str]:
    """The direct line (no record made: `makeRecord` would fail) and the standard path's line."""
    with monkeypatch.context() as patched:
        patched.setattr(logging.Logger, "makeRecord", lambda *a, **k: pytest.fail("a record was made"))
        log_call(call, worker=4242)
    fields = call_fields(call) | {"worker": 4242}
    logging.getLogger(REQUEST_LOGGER).info("request", extra={"fields": fields})
    direct, standard = out.getvalue().splitlines()
    return direct, standard


def test_text_line_is_the_standard_paths_line(stream: io.StringIO, monkeypatch: pytest.MonkeyPatch) -> None:
    use(stream, TextFormatter())
    direct, standard = both_ways(stream, finished_call(), monkeypatch)
    stamp = len("2026-01-01 12:00:00,000")
    assert direct[stamp:] == standard[stamp:]
    assert direct[stamp:].startswith(" INFO tokenrelay.requests: request request_id=0192f0a0")
    assert 'model="odd \\"model\\"" backend=upstream node=gpu-1' in direct and 'key="ci bot"' in direct


def test_json_line_is_the_standard_paths_line(stream: io.StringIO, monkeypatch: pytest.MonkeyPatch) -> None:
    use(stream, JsonFormatter())
    direct, standard = (json.loads(line) for line in both_ways(stream, finished_call(), monkeypatch))
    assert direct.pop("ts").endswith("+00:00") and standard.pop("ts").endswith("+00:00")
    assert direct == standard
    assert direct["worker"] == 4242 and direct["ttft_ms"] == 12.3 and direct["usage_estimated"] is None


def test_any_other_set_up_gets_the_records(stream: io.StringIO) -> None:
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
