"""The Messages routes, served by the generation lane (`tokenrelay.openai.lane`) rather than a FastAPI router.

The lane already reads its own bodies, authenticates inline and renders its own errors, which is what these
routes need to differ in: the key may come in `x-api-key`, and every error (a missing key included) must be
in Anthropic's shape, which the app-wide key middleware and FastAPI's handlers would write in OpenAI's. The
cost is that the routes are not listed in `/openapi.json`; their request models are in `protocol.py`.
`anthropic-version` (and `anthropic-beta`) headers are accepted and not needed: there is one version here.
"""

from __future__ import annotations

from tokenrelay.anthropic.messages.errors import error_response
from tokenrelay.anthropic.messages.serving import count_tokens, create_message
from tokenrelay.auth.bearer import scope_api_key
from tokenrelay.openai.lane import Route


def routes() -> dict[str, Route]:
    return {
        "/v1/messages": Route(create_message, error_response, scope_api_key),
        "/v1/messages/count_tokens": Route(count_tokens, error_response, scope_api_key),
    }
