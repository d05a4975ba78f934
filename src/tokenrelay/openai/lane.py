"""The generation endpoints as a plain ASGI app in front of FastAPI.

`/v1/chat/completions` and `/v1/completions` are most of a gateway's traffic, and FastAPI's router,
middlewares and dependency machinery add nothing they use: they read their own body, validate it with the
protocol models and answer through `handle`. Other generation APIs (Anthropic's Messages) join as `Route`s
with their own key header and error shape. Every other path goes to the FastAPI app.

The lane does inline what the app's request-id and key-auth middlewares do (with the same functions), so
the id header goes on the response once instead of through a wrapped `send` that sees every SSE frame.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from fastapi import FastAPI
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from tokenrelay.apidoc.operations import lane_operation
from tokenrelay.auth.bearer import scope_bearer_token
from tokenrelay.auth.middleware import authenticate
from tokenrelay.calls.request_ids import assign_request_id
from tokenrelay.errors import APIError, InvalidRequest, error_response
from tokenrelay.openai.chat.serving import ChatEndpoint
from tokenrelay.openai.completions.serving import CompletionsEndpoint
from tokenrelay.openai.serving import handle
from tokenrelay.protocol.chat import ChatCompletionRequest
from tokenrelay.protocol.completions import CompletionRequest

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Route:
    """One POST path of the lane: what answers it, how its errors look, where its key is read from, and its
    operation in the OpenAPI document (FastAPI does not see these paths)."""

    respond: Callable[[Request], Awaitable[Response]]
    error: Callable[[APIError], Response] = error_response
    key: Callable[[Scope], str | None] = scope_bearer_token
    openapi: dict[str, Any] | None = None


# What a generation can answer with besides its result (the key check adds 401 and 503 in the document).
GENERATION_ERRORS = (400, 404, 413, 429, 502, 503)


def openai_routes() -> dict[str, Route]:
    chat = lane_operation(
        ChatCompletionRequest,
        summary="Create chat completion",
        answer="A chat.completion object, or with `stream: true` its chunks (SSE, ending with [DONE]).",
        statuses=GENERATION_ERRORS,
    )
    completion = lane_operation(
        CompletionRequest,
        summary="Create completion",
        answer="A text_completion object, or with `stream: true` its chunks (SSE, ending with [DONE]).",
        statuses=GENERATION_ERRORS,
    )
    return {
        "/v1/chat/completions": Route(functools.partial(handle, endpoint=ChatEndpoint()), openapi=chat),
        "/v1/completions": Route(functools.partial(handle, endpoint=CompletionsEndpoint()), openapi=completion),
    }


class GenerationLane:
    """Serves the generation paths; the rest of the app sits behind it."""

    def __init__(self, app: FastAPI, more: dict[str, Route] | None = None) -> None:
        self.app = app
        self.routes = openai_routes() | (more or {})

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"] in self.routes:
            await self._serve(scope, receive, send)
            return
        await self.app(scope, receive, send)

    async def _serve(self, scope: Scope, receive: Receive, send: Send) -> None:
        scope["app"] = self.app  # what Starlette sets: `handle` finds the services there
        request_id = assign_request_id(scope)
        response = await self._respond(scope, receive, self.routes[scope["path"]])
        response.raw_headers.append((b"x-request-id", request_id.encode("latin-1")))
        await response(scope, receive, send)

    async def _respond(self, scope: Scope, receive: Receive, route: Route) -> Response:
        try:
            await authenticate(scope, route.key(scope))  # first, as for every /v1 path: no key, no information
            if scope["method"] != "POST":
                raise MethodNotAllowed(scope["method"], scope["path"])
            return await route.respond(Request(scope, receive))
        except APIError as exc:
            return route.error(exc)
        except Exception:  # the same answer FastAPI's handler gives: an error body, details in the log
            log.exception("unhandled error on %s", scope["path"])
            return route.error(APIError("The server had an error while processing your request."))


class MethodNotAllowed(InvalidRequest):
    status = 405

    def __init__(self, method: str, path: str) -> None:
        super().__init__(f"{path} takes POST, not {method}.", headers={"Allow": "POST"})
