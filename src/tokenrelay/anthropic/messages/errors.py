"""The APIError family in Anthropic's shape: `{"type": "error", "error": {"type", "message"}}` and its statuses.

The OpenAI endpoints keep their own shape; only the Messages routes render errors through here.
"""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError
from starlette.responses import JSONResponse

from tokenrelay.errors import (
    INVALID_VALUE,
    UNSUPPORTED_PARAMETER,
    APIError,
    AuthenticationError,
    ContextExceeded,
    InvalidRequest,
    ModelNotFound,
    NotFound,
    Overloaded,
    PermissionDenied,
    QuotaExceeded,
    RateLimited,
    field_path,
    from_validation_error,
)

OVERLOADED_STATUS = 529  # Anthropic's status for "overloaded" (a full queue, no node free)


def error_kind(exc: APIError) -> tuple[str, int]:
    """Anthropic's error type and HTTP status for an error of the family."""
    if isinstance(exc, AuthenticationError):
        return "authentication_error", 401
    if isinstance(exc, PermissionDenied):
        return "permission_error", 403
    if isinstance(exc, ModelNotFound | NotFound):
        return "not_found_error", 404
    if isinstance(exc, RateLimited | QuotaExceeded):
        return "rate_limit_error", 429
    if isinstance(exc, Overloaded):
        return "overloaded_error", OVERLOADED_STATUS
    if exc.status == 413:
        return "request_too_large", 413
    if exc.status >= 500:
        return "api_error", exc.status
    return "invalid_request_error", exc.status


def error_body(exc: APIError) -> dict[str, Any]:
    kind, _ = error_kind(exc)
    return {"type": "error", "error": {"type": kind, "message": message_of(exc)}}


def message_of(exc: APIError) -> str:
    """The message, but an overflow in Anthropic's own words (Claude Code compacts its conversation on the first
    and lowers `max_tokens` on the second, reading the numbers)."""
    if not isinstance(exc, ContextExceeded):
        return exc.message
    if exc.prompt_too_long:
        return f"prompt is too long: {exc.prompt_tokens} tokens > {exc.context - 1} maximum"
    return (
        f"input length and `max_tokens` exceed context limit: {exc.prompt_tokens} + {exc.max_tokens} > "
        f"{exc.context}, decrease input length or `max_tokens` and try again"
    )


def error_response(exc: APIError) -> JSONResponse:
    _, status = error_kind(exc)
    return JSONResponse(error_body(exc), status_code=status, headers=exc.headers)


def invalid_body(exc: ValidationError, body: Any = None) -> InvalidRequest:
    """Pydantic's most specific complaint as one 400 naming the field; one this API does not know is named as such.

    Of a union's complaints (content as a string, or as blocks) the deepest is the one about what was sent.
    `body`, the parsed JSON, lets `param` be the field's path in it, without the union tags pydantic adds."""
    errors = exc.errors(include_url=False)
    worst = max(errors, key=lambda error: len(error.get("loc", ())))
    if worst.get("type") == "json_invalid":
        return from_validation_error(exc)
    path = field_path(worst.get("loc", ()), body)
    if worst.get("type") in ("union_tag_invalid", "union_tag_not_found"):
        path.append(str(worst.get("ctx", {}).get("discriminator", "")).strip("'"))  # the tag's own field
    param = ".".join(str(part) for part in path) or None
    if worst.get("type") == "extra_forbidden":
        return InvalidRequest(f"`{param}`: this field is not supported.", param=param, code=UNSUPPORTED_PARAMETER)
    where = f" at `{param}`" if param else ""
    return InvalidRequest(f"Invalid value{where}: {worst.get('msg')}", param=param, code=INVALID_VALUE)
