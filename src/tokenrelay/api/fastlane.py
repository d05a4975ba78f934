"""The generation endpoints as a plain ASGI app in front of FastAPI: the relay's hot path.

`POST /v1/chat/completions` and `POST /v1/completions` are most of a gateway's traffic. FastAPI's stack
(its router, exception and body-limit middlewares, per-route dependency machinery) cost about a tenth of each
relayed request's CPU in a profile here (py-spy, 64 concurrent clients against a mock node) while adding
nothing these two routes use: they read their own body, validate it with the protocol models and answer
through `handle`. Every other request (other paths, other methods) goes to the FastAPI app.

The lane does inline what the app's request-id and key-auth middlewares do (with the same functions),
because a middleware that stamps its header on the way out wraps every `send`: one call per SSE frame.
Here the header goes on the response object once, before it is sent.
"""

from __future__ import annotations

import logging

from fastapi import FastAPI
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from tokenrelay.api.chat import ChatEndpoint
from tokenrelay.api.completions import CompletionsEndpoint
from tokenrelay.api.generation import Endpoint, handle
from tokenrelay.auth.middleware import authenticate
from tokenrelay.errors import APIError, error_response
from tokenrelay.requestid import assign_request_id

log = logging.getLogger(__name__)


class GenerationLane:
    """Serves the two generation routes; the rest of the app sits behind it."""

    def __init__(self, app: FastAPI) -> None:
        self.app = app
        self.endpoints: dict[str, Endpoint] = {
            "/v1/chat/completions": ChatEndpoint(),
            "/v1/completions": CompletionsEndpoint(),
        }

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] == "POST" and scope["path"] in self.endpoints:
            await self._serve(scope, receive, send)
            return
        await self.app(scope, receive, send)

    async def _serve(self, scope: Scope, receive: Receive, send: Send) -> None:
        scope["app"] = self.app  # what Starlette sets: `handle` finds the services there
        request_id = assign_request_id(scope)
        response = await self._respond(scope, receive)
        response.raw_headers.append((b"x-request-id", request_id.encode("latin-1")))
        await response(scope, receive, send)

    async def _respond(self, scope: Scope, receive: Receive) -> Response:
        try:
            await authenticate(scope)
            return await handle(Request(scope, receive), self.endpoints[scope["path"]])
        except APIError as exc:
            return error_response(exc)
        except Exception:  # the same answer FastAPI's handler gives: an OpenAI error body, details in the log
            log.exception("unhandled error on %s", scope["path"])
            return error_response(APIError("The server had an error while processing your request."))
