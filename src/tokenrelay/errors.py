"""Typed API errors and the one place that renders the OpenAI error body."""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError
from starlette.responses import JSONResponse

# Error codes (an error body's `code`) that more than one module raises, or that a caller tells errors apart by.
CONTEXT_LENGTH_EXCEEDED = "context_length_exceeded"
UNSUPPORTED_PARAMETER = "unsupported_parameter"
UNSUPPORTED_CONTENT = "unsupported_content"
INVALID_VALUE = "invalid_value"
INVALID_JSON = "invalid_json"
MISSING_REQUIRED_PARAMETER = "missing_required_parameter"


class APIError(Exception):
    """An error that reaches the client as `{"error": {message, type, param, code}}`."""

    status: int = 500
    type: str = "server_error"
    code: str | None = None

    def __init__(
        self,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        status: int | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        if code is not None:
            self.code = code
        if status is not None:
            self.status = status
        self.headers = headers or {}

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


class InvalidRequest(APIError):
    status = 400
    type = "invalid_request_error"


class ContextExceeded(InvalidRequest):
    """A prompt, or a prompt and the tokens asked for after it, longer than the model's context. Said in OpenAI's
    words, which clients match to shorten a conversation (LiteLLM's context fallbacks); the numbers are kept for
    the dialects that say it their own way (Anthropic's, which Claude Code reads to compact or lower max_tokens)."""

    code = CONTEXT_LENGTH_EXCEEDED

    def __init__(self, prompt_tokens: int, max_tokens: int, context: int, *, param: str) -> None:
        self.prompt_tokens, self.max_tokens, self.context = prompt_tokens, max_tokens, context
        if self.prompt_too_long:
            message = (
                f"This model's maximum context length is {context} tokens. However, your messages resulted in "
                f"{prompt_tokens} tokens, which leaves no room for the answer. "
                "Please reduce the length of the messages."
            )
        else:
            message = (
                f"This model's maximum context length is {context} tokens. However, you requested "
                f"{prompt_tokens + max_tokens} tokens ({prompt_tokens} in the messages, {max_tokens} in the "
                "completion). Please reduce the length of the messages or completion."
            )
        super().__init__(message, param=param if self.prompt_too_long else "max_tokens")

    @property
    def prompt_too_long(self) -> bool:
        return self.prompt_tokens >= self.context


class AuthenticationError(APIError):
    status = 401
    type = "invalid_request_error"
    code = "invalid_api_key"


class PermissionDenied(APIError):
    status = 403
    type = "invalid_request_error"
    code = "permission_denied"


class ModelNotFound(APIError):
    status = 404
    type = "invalid_request_error"
    code = "model_not_found"

    def __init__(self, model: str) -> None:
        super().__init__(f"The model `{model}` does not exist or you do not have access to it.", param="model")


class NotFound(APIError):
    status = 404
    type = "invalid_request_error"
    code = "not_found"


class RateLimited(APIError):
    status = 429
    type = "rate_limit_error"
    code = "rate_limit_exceeded"


class QuotaExceeded(APIError):
    """The key's token budget (its prepaid allowance) cannot cover the request."""

    status = 429
    type = "insufficient_quota"
    code = "insufficient_quota"


class Overloaded(APIError):
    """The server cannot take the request now; the client may retry later."""

    status = 503
    type = "server_error"
    code = "server_overloaded"


class UpstreamError(APIError):
    status = 502
    type = "server_error"
    code = "upstream_error"


def from_validation_error(exc: ValidationError, sent: Any = None) -> InvalidRequest:
    """Turn pydantic's first complaint into one OpenAI-style 400 naming the field (`sent`, the parsed body
    when known, tells a tagged union's tag from a field name: see `field_path`)."""
    first = max(exc.errors(include_url=False), key=_news)
    where = first.get("loc", ())
    loc = [str(part) for part in (field_path(where, sent) if sent is not None else where) if not _is_union_tag(part)]
    param = ".".join(loc) or None
    kind = first.get("type", "")
    if kind == "json_invalid":
        return InvalidRequest(f"The request body is not valid JSON: {first.get('msg')}", code=INVALID_JSON)
    message = first.get("msg", "invalid value")
    at = f" at `{param}`" if param else ""
    return InvalidRequest(f"Invalid value{at}: {message}", param=param, code=INVALID_VALUE)


def _news(error: Any) -> tuple[bool, int]:
    """How much a complaint says about what was sent: of a union's branches, one whose type matched the value
    (so a value was wrong, not its type) and then the deepest; the first among equals."""
    loc = [part for part in error.get("loc", ()) if not _is_union_tag(part)]
    return not str(error.get("type", "")).endswith("_type"), len(loc)


def field_path(loc: tuple[int | str, ...], body: Any) -> list[int | str]:
    """`loc` walked through the body: what does not lead into it is a union's branch name (`list[...]`) or a
    tagged union's tag (a block's `type`, a message's `role`), which names no field."""
    path: list[int | str] = []
    node, tag_seen = body, False
    for i, part in enumerate(loc):
        if i == len(loc) - 1:
            if not (isinstance(part, str) and ("[" in part or (not isinstance(node, dict) and part in BRANCHES))):
                path.append(part)
        elif isinstance(node, dict) and not tag_seen and part in (node.get("type"), node.get("role")):
            tag_seen = True  # the tag comes first, and once: a field named like it (a text block's `text`) follows
        elif (isinstance(node, dict) and part in node) or (
            isinstance(node, list) and isinstance(part, int) and 0 <= part < len(node)
        ):
            path.append(part)
            node, tag_seen = node[part], False  # type: ignore[index]
    return path


# The names pydantic gives a union's plain branches.
BRANCHES = frozenset({"str", "int", "float", "bool", "list", "dict", "none"})


def _is_union_tag(part: object) -> bool:
    # pydantic puts union member names (e.g. "str", "list[int]", "function-after[...]") into `loc`;
    # they mean nothing to a client reading `param`.
    return isinstance(part, str) and (
        "[" in part or part.startswith("constrained-") or part in {"str", "int", "list", "dict", "bool", "float"}
    )


def error_response(exc: APIError) -> JSONResponse:
    return JSONResponse(exc.body(), status_code=exc.status, headers=exc.headers)
