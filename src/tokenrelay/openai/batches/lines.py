"""A batch's input file → its request lines, or every offending line named (the batch then fails).

Each line is `{"custom_id", "method": "POST", "url", "body"}`: `custom_id` unique in the file, `url` the batch's
endpoint, and `body` valid exactly as that endpoint validates a request (the same models and the same 400s),
for a model this server serves and the batch's key may use. Lines are numbered from 1, as in the errors.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tokenrelay.api.parsing import validate_json
from tokenrelay.errors import APIError
from tokenrelay.openai.responses.serving import parse as parse_responses
from tokenrelay.protocol.chat import ChatCompletionRequest
from tokenrelay.protocol.completions import CompletionRequest
from tokenrelay.protocol.embeddings import EmbeddingRequest
from tokenrelay.store.batches import InputLine

# The endpoints a batch may name, each with the validation its route applies to a body.
Validator = Callable[[bytes, int], Any]
VALIDATORS: dict[str, Validator] = {
    "/v1/chat/completions": lambda raw, max_n: validate_json(ChatCompletionRequest, raw, {"max_n": max_n}),
    "/v1/completions": lambda raw, max_n: validate_json(CompletionRequest, raw, {"max_n": max_n}),
    "/v1/embeddings": lambda raw, _: validate_json(EmbeddingRequest, raw),
    "/v1/responses": lambda raw, _: parse_responses(raw),
}
ENDPOINTS = tuple(VALIDATORS)

MAX_ERRORS = 1000  # a batch's error list names at most this many lines


@dataclass
class Checked:
    lines: list[InputLine]
    errors: list[dict[str, Any]]


def check_input(
    content: bytes, endpoint: str, max_lines: int, max_n: int, usable: Callable[[str], str | None]
) -> Checked:
    """The file's lines, checked; `usable(model)` says why a model cannot be used (None when it can)."""
    checked = Checked([], [])
    seen: set[str] = set()
    rows = [row for row in content.splitlines() if row.strip()]
    if not rows:
        checked.errors.append(_error("empty_file", "The input file has no request lines.", None, None))
    if len(rows) > max_lines:
        message = f"The input file has {len(rows)} lines; a batch takes at most {max_lines}."
        checked.errors.append(_error("too_many_lines", message, None, None))
        return checked
    for number, row in enumerate(content.splitlines(), start=1):
        if not row.strip():
            continue
        problem = _check_line(number, row, endpoint, max_n, usable, seen, checked)
        if problem is not None and len(checked.errors) < MAX_ERRORS:
            checked.errors.append(problem)
    return checked


def _check_line(
    number: int,
    row: bytes,
    endpoint: str,
    max_n: int,
    usable: Callable[[str], str | None],
    seen: set[str],
    checked: Checked,
) -> dict[str, Any] | None:
    try:
        request = json.loads(row)
    except ValueError:
        return _error("invalid_json_line", "This line is not valid JSON.", None, number)
    if not isinstance(request, dict):
        return _error("invalid_json_line", "Each line must be a JSON object.", None, number)
    custom_id, method, url, body = (request.get(k) for k in ("custom_id", "method", "url", "body"))
    if not isinstance(custom_id, str) or not custom_id:
        return _error("missing_required_parameter", "The line has no `custom_id` string.", "custom_id", number)
    if custom_id in seen:
        return _error(
            "duplicate_custom_id", f"The custom_id {custom_id!r} is used more than once.", "custom_id", number
        )
    seen.add(custom_id)
    if method != "POST":
        return _error("invalid_method", "`method` must be POST.", "method", number)
    if url != endpoint:
        message = f"The line's url {url!r} is not the batch's endpoint {endpoint!r}."
        return _error("mismatched_url", message, "url", number)
    if not isinstance(body, dict):
        return _error("missing_required_parameter", "The line has no `body` object.", "body", number)
    if body.get("stream"):
        return _error("invalid_value", "Batch lines cannot stream; leave out `stream`.", "body.stream", number)
    try:
        parsed = VALIDATORS[endpoint](json.dumps(body).encode(), max_n)
    except APIError as exc:
        param = f"body.{exc.param}" if exc.param else "body"
        return _error(exc.code or "invalid_request", exc.message, param, number)
    refusal = usable(parsed.model)
    if refusal is not None:
        return _error("model_not_found", refusal, "body.model", number)
    checked.lines.append(InputLine(number, custom_id, body))
    return None


def _error(code: str, message: str, param: str | None, line: int | None) -> dict[str, Any]:
    return {"code": code, "message": message, "param": param, "line": line}
