"""Log formatting (text and JSON) and startup progress reporting, in-process."""

from __future__ import annotations

import json
import logging

import pytest

from tokenrelay.observability.logs import TEXT_FORMAT, JsonFormatter, TextFormatter, TextValues, logfmt, logfmt_value
from tokenrelay.observability.progress import Progress


def record(msg: str = "request", fields: dict[str, object] | None = None, **extra: object) -> logging.LogRecord:
    rec = logging.LogRecord("tokenrelay.requests", logging.INFO, __file__, 1, msg, (), None)
    if fields is not None:
        rec.fields = fields
    rec.__dict__.update(extra)
    return rec


def test_logfmt_quotes_what_would_break_a_line() -> None:
    line = logfmt({"model": "evil\nmodel=x", "plain": "gemma-3-270m", "empty": "", "stream": True, "gone": None})
    assert "\n" not in line
    assert line == 'model="evil\\nmodel=x" plain=gemma-3-270m empty="" stream=true'


def test_text_formatter_appends_fields() -> None:
    line = TextFormatter().format(record(fields={"request_id": "abc", "status": 200, "key": None}))
    assert line.endswith("INFO tokenrelay.requests: request request_id=abc status=200")


def test_json_formatter_merges_fields_and_keeps_nulls() -> None:
    body = json.loads(JsonFormatter().format(record(fields={"request_id": "abc", "key": None, "ttft_ms": 12.5})))
    assert body["msg"] == "request"
    assert body["level"] == "info"
    assert body["logger"] == "tokenrelay.requests"
    assert body["request_id"] == "abc"
    assert body["ttft_ms"] == 12.5
    assert "key" in body and body["key"] is None
    assert body["ts"].endswith("+00:00")


def test_json_formatter_carries_tracebacks() -> None:
    try:
        raise ValueError("boom")
    except ValueError:
        import sys

        rec = record(msg="failed", exc_info=sys.exc_info())
    body = json.loads(JsonFormatter().format(rec))
    assert "ValueError: boom" in body["exc"]


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_progress_logs_now_and_then_and_at_the_end(caplog: pytest.LogCaptureFixture) -> None:
    clock = Clock()
    progress = Progress("loading model m", logging.getLogger("test.progress"), live=False, interval=5, clock=clock)
    with caplog.at_level(logging.INFO, logger="test.progress"):
        for step in range(1, 11):  # 10 updates, one second apart
            clock.now = float(step)
            progress.update(step / 10, f"({step}/10)")
    messages = [r.getMessage() for r in caplog.records]
    assert messages == ["loading model m: 60% (6/10)", "loading model m: 100% (10/10)"]


def test_progress_draws_one_line_on_a_terminal(capsys: pytest.CaptureFixture[str]) -> None:
    progress = Progress("assembling x", logging.getLogger("test.progress"), live=True)
    for fraction in (0.25, 0.25, 0.5, 1.0):
        progress.update(fraction)
    err = capsys.readouterr().err
    assert err == "\rassembling x:  25%\rassembling x:  50%\rassembling x: 100%\n"


def test_text_formatter_memo_writes_what_the_plain_path_writes() -> None:
    values = ["gemma-3-270m", "chat.completions", "a b", 'quo"te', "k=v", "back\\slash", "", "ünï-cödé", "0192abcDEF"]
    formatter = TextFormatter()
    for _ in range(2):  # the second pass is answered from the memo
        for value in values:
            fields = {"model": value, "status": 200, "stream": False, "ttft_ms": 1.5}
            assert formatter.format(record(fields=fields)).endswith(" request " + logfmt(fields))
            assert logfmt(fields) == f"model={logfmt_value(value)} status=200 stream=false ttft_ms=1.5"


def test_text_value_memo_is_bounded() -> None:
    texts = TextValues()
    for n in range(TextValues.LIMIT + 10):
        assert texts(f"model-{n}") == f"model-{n}"
    assert len(texts.known) <= TextValues.LIMIT


def test_text_formatter_time_matches_the_standard_formatter_across_seconds() -> None:
    ours, standard = TextFormatter(), logging.Formatter(TEXT_FORMAT)
    for created in (1_700_000_000.001, 1_700_000_000.999, 1_700_000_001.0, 1_700_000_001.5, 1_700_003_600.25):
        rec = record()
        rec.created, rec.msecs = created, (created - int(created)) * 1000
        assert ours.formatTime(rec) == standard.formatTime(rec)
