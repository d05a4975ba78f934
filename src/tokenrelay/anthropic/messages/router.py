"""`POST /v1/messages` and `POST /v1/messages/count_tokens`.

Their key may come in `x-api-key` and every error they answer with (a missing key included) is in Anthropic's
shape: the app's `Dialects` give these paths that (`auth/dialects.py`). The bodies are validated by the
endpoints themselves, so FastAPI is only told their schemas (built from the request models in `protocol.py`).
`anthropic-version` (and `anthropic-beta`) headers are accepted and not needed: there is one version here.
"""

from __future__ import annotations

from fastapi import APIRouter, Request
from starlette.responses import Response

from tokenrelay.anthropic.messages.errors import error_response
from tokenrelay.anthropic.messages.protocol import CountTokensRequest, MessagesRequest
from tokenrelay.anthropic.messages.serving import count_tokens, create_message
from tokenrelay.api.direct_route import DirectRoute
from tokenrelay.apidoc.errors import AnthropicError
from tokenrelay.apidoc.operations import answers, json_body
from tokenrelay.auth.bearer import scope_api_key
from tokenrelay.auth.dialects import Dialect
from tokenrelay.calls.request_ids import id_header

PREFIX = "/v1/messages"


def anthropic_id_headers(request_id: str) -> list[tuple[bytes, bytes]]:
    """Every path's `x-request-id`, and `request-id`, which Anthropic's clients read (and put in their errors)."""
    name, value = id_header(request_id)
    return [(name, value), (b"request-id", value)]


DIALECT = Dialect(key=scope_api_key, error=error_response, id_headers=anthropic_id_headers)
# Anthropic's statuses: its overloaded answer is 529.
ERRORS = (400, 401, 404, 413, 429, 500, 502, 503, 529)

router = APIRouter(route_class=DirectRoute)


@router.post(
    PREFIX,
    summary="Create message",
    operation_id="create_message",
    openapi_extra=json_body(MessagesRequest),
    responses=answers(
        "A message object, or with `stream: true` Anthropic's named stream events (SSE).",
        ERRORS,
        error_body=AnthropicError,
    ),
)
async def create(request: Request) -> Response:
    return await create_message(request)


@router.post(
    f"{PREFIX}/count_tokens",
    summary="Count message tokens",
    operation_id="count_message_tokens",
    openapi_extra=json_body(CountTokensRequest),
    responses=answers(
        '`{"input_tokens": n}`: the prompt\'s length in tokens.', ERRORS, error_body=AnthropicError, streams=False
    ),
)
async def count(request: Request) -> Response:
    return await count_tokens(request)
