"""Request bodies → validated protocol models, with OpenAI-style 400s."""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

import numpy as np
from pydantic import BaseModel, ValidationError
from starlette.requests import Request
from starlette.types import Receive

from tokenrelay.api.server import services_of
from tokenrelay.calls.record import Call, ClientGone
from tokenrelay.errors import INVALID_JSON, InvalidRequest, from_validation_error
from tokenrelay.protocol.common import GenerationRequest

log = logging.getLogger(__name__)

Model = TypeVar("Model", bound=GenerationRequest)
Wire = TypeVar("Wire", bound=BaseModel)
Strict = TypeVar("Strict", bound=BaseModel)

MAX_BODY_BYTES = 32 << 20

# Deeper than any real request goes (pydantic's JSON parser itself stops near 200 levels). Checked before any
# parser sees the body: the standard library's raises RecursionError on deep input and some C parsers crash.
MAX_DEPTH = 128
MAX_MODEL_CHARS = 256
_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"')
_OPENERS, _CLOSERS = np.frombuffer(b"[{", np.uint8), np.frombuffer(b"]}", np.uint8)


async def parse_body(request: Request, call: Call, model: type[Model], max_n: int) -> Model:
    raw = await read_body(request.receive)
    with claims_noted(call, raw):
        parsed = validate_json(model, raw, {"max_n": max_n})
    _note_extras(request, parsed)
    return parsed


@contextmanager
def claims_noted(call: Call, raw: bytes) -> Iterator[None]:
    """Validation of a generation's body: when it fails, the model and `stream` the body asks for are noted on
    the call first, so that the request log and the ledger name them for an invalid request too."""
    try:
        yield
    except InvalidRequest:
        claimed = _shallow_json(raw)
        if isinstance(claimed, dict):
            model, stream = claimed.get("model"), claimed.get("stream")
            call.model = model[:MAX_MODEL_CHARS] if isinstance(model, str) else call.model
            call.streamed = stream if isinstance(stream, bool) else call.streamed
        raise


async def read_body(receive: Receive) -> bytes:
    """The request body, read straight from ASGI messages (Starlette's `Request.body()` adds an async
    generator per message) and refused once it passes `MAX_BODY_BYTES`, before the rest is buffered."""
    parts: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ClientGone
        part = message.get("body", b"")
        size += len(part)
        if size > MAX_BODY_BYTES:
            raise InvalidRequest("The request body is too large.", code="request_too_large", status=413)
        parts.append(part)
        if not message.get("more_body", False):
            return parts[0] if len(parts) == 1 else b"".join(parts)


# A validation error and the body as parsed JSON (None if it is none) -> the API's 400 naming the field.
Complaint = Callable[[ValidationError, Any], InvalidRequest]


def validate_json(
    model: type[Wire], body: bytes, context: dict[str, Any] | None = None, complaint: Complaint = from_validation_error
) -> Wire:
    """Strict JSON validation of a request body; an empty body, or any complaint (as `complaint` words it), is one
    400 naming the field."""
    if not body.strip():
        raise InvalidRequest("The request body is empty; a JSON object is required.", code=INVALID_JSON)
    try:
        return validate_strict(model, body, context)
    except ValidationError as exc:
        raise complaint(exc, _parsed(body)) from None


def validate_strict(model: type[Strict], body: bytes, context: dict[str, Any] | None = None) -> Strict:
    """`model.model_validate_json` in strict mode, where a whole number written with a fraction (`2.0`) is still
    an integer, as JSON Schema counts it; `ValidationError` for anything else, and a 400 for a body nested
    deeper than `MAX_DEPTH`."""
    check_depth(body)
    try:
        return model.model_validate_json(body, strict=True, context=context)
    except ValidationError as exc:
        if not any(_whole_float(error) for error in exc.errors(include_url=False)):
            raise
    # Rare (a client that writes every number as a float), so the body is parsed once more only then.
    return model.model_validate_json(json.dumps(_as_integers(json.loads(body))), strict=True, context=context)


def check_depth(body: bytes) -> None:
    """A 400 when the body's arrays and objects nest deeper than `MAX_DEPTH` (brackets inside strings do not count)."""
    if body.count(b"[") + body.count(b"{") <= MAX_DEPTH:  # the usual body: it cannot nest that deep
        return
    structure = np.frombuffer(_STRING.sub(b"", body), np.uint8)
    steps = np.isin(structure, _OPENERS).astype(np.int32) - np.isin(structure, _CLOSERS)
    if steps.size and int(np.cumsum(steps).max()) > MAX_DEPTH:
        raise InvalidRequest(
            f"The request body nests arrays and objects deeper than {MAX_DEPTH} levels.", code=INVALID_JSON
        )


def _shallow_json(body: bytes) -> Any:
    """The body parsed, or None when it is not JSON or nests too deep to parse safely."""
    try:
        check_depth(body)
    except InvalidRequest:
        return None
    return _parsed(body)


def _parsed(body: bytes) -> Any:
    try:
        return json.loads(body)
    except ValueError:
        return None


def _whole_float(error: Any) -> bool:
    value = error.get("input")
    return error.get("type") == "int_type" and isinstance(value, float) and value.is_integer()


def _as_integers(value: Any) -> Any:
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, list):
        return [_as_integers(item) for item in value]
    if isinstance(value, dict):
        return {key: _as_integers(item) for key, item in value.items()}
    return value


def _note_extras(request: Request, parsed: GenerationRequest) -> None:
    """Unknown fields are accepted; each name is logged once per server."""
    seen: set[str] = services_of(request).extras_seen
    for name in parsed.extra_fields():
        if name not in seen:
            seen.add(name)
            log.info(
                "request field %r is not part of the OpenAI API: the embedded engine ignores it, upstream nodes "
                "receive it (logged once)",
                name,
            )
