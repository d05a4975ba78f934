"""A batch's input file checked line by line, as `POST /v1/batches` validation does before anything runs."""

from __future__ import annotations

import json
from typing import Any

from tokenrelay.openai.batches.lines import check_input

ENDPOINT = "/v1/chat/completions"


def line(custom_id: str = "a", **body: Any) -> dict[str, Any]:
    request = {"model": "m", "messages": [{"role": "user", "content": "hi"}]} | body
    return {"custom_id": custom_id, "method": "POST", "url": ENDPOINT, "body": request}


def check(*rows: Any, max_lines: int = 100, usable: Any = None) -> Any:
    content = b"\n".join(row if isinstance(row, bytes) else json.dumps(row).encode() for row in rows)
    return check_input(content, ENDPOINT, max_lines, 4, usable or (lambda model: None))


def test_valid_lines_keep_their_numbers_ids_and_bodies() -> None:
    checked = check(line("a"), b"", line("b", max_tokens=3))
    assert checked.errors == []
    assert [(x.line, x.custom_id, x.body.get("max_tokens")) for x in checked.lines] == [(1, "a", None), (3, "b", 3)]


def test_each_offending_line_is_named_with_the_field() -> None:
    checked = check(
        line("a"),
        b"[1, 2]",
        line("a"),
        {**line("c"), "method": "GET"},
        line("d", n=9),
        line("e", stream=True),
        {"custom_id": "f", "method": "POST", "url": ENDPOINT},
    )
    found = [(e["line"], e["code"], e["param"]) for e in checked.errors]
    assert found[:4] == [
        (2, "invalid_json_line", None),
        (3, "duplicate_custom_id", "custom_id"),
        (4, "invalid_method", "method"),
        (5, found[3][1], "body.n"),  # the endpoint's own 400 for n over max_n, under the body
    ]
    assert found[4:] == [(6, "invalid_value", "body.stream"), (7, "missing_required_parameter", "body")]


def test_a_model_the_key_cannot_use_is_named() -> None:
    checked = check(line("a", model="secret"), usable=lambda model: f"no {model}")
    assert checked.errors == [{"code": "model_not_found", "message": "no secret", "param": "body.model", "line": 1}]


def test_too_many_lines_and_an_empty_file_fail_the_whole_file() -> None:
    assert [e["code"] for e in check(line("a"), line("b"), max_lines=1).errors] == ["too_many_lines"]
    assert [e["code"] for e in check(b"", b"  ").errors] == ["empty_file"]
