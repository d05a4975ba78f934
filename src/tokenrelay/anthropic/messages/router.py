"""The Messages routes, served by the generation lane (`tokenrelay.openai.lane`) rather than a FastAPI router.

The lane already reads its own bodies, authenticates inline and renders its own errors, which is what these
routes need to differ in: the key may come in `x-api-key`, and every error (a missing key included) must be
in Anthropic's shape, which the app-wide key middleware and FastAPI's handlers would write in OpenAI's. Their
operations in `/openapi.json` are built from the request models in `protocol.py`.
`anthropic-version` (and `anthropic-beta`) headers are accepted and not needed: there is one version here.
"""

from __future__ import annotations

from tokenrelay.anthropic.messages.errors import error_response
from tokenrelay.anthropic.messages.protocol import CountTokensRequest, MessagesRequest
from tokenrelay.anthropic.messages.serving import count_tokens, create_message
from tokenrelay.apidoc.errors import AnthropicError
from tokenrelay.apidoc.operations import lane_operation
from tokenrelay.auth.bearer import scope_api_key
from tokenrelay.openai.lane import Route

# Anthropic's statuses: its overloaded answer is 529.
ERRORS = (400, 401, 404, 413, 429, 500, 502, 503, 529)


def routes() -> dict[str, Route]:
    create = lane_operation(
        MessagesRequest,
        summary="Create message",
        answer="A message object, or with `stream: true` Anthropic's named stream events (SSE).",
        statuses=ERRORS,
        error_body=AnthropicError,
    )
    count = lane_operation(
        CountTokensRequest,
        summary="Count message tokens",
        answer='`{"input_tokens": n}`: the prompt\'s length in tokens.',
        statuses=ERRORS,
        error_body=AnthropicError,
        streams=False,
    )
    return {
        "/v1/messages": Route(create_message, error_response, scope_api_key, openapi=create),
        "/v1/messages/count_tokens": Route(count_tokens, error_response, scope_api_key, openapi=count),
    }
