"""The generation endpoints as a plain ASGI app in front of FastAPI: the relay's hot path.

`POST /v1/chat/completions` and `POST /v1/completions` are most of a gateway's traffic. FastAPI's stack
(its router, exception and body-limit middlewares, per-route dependency machinery) cost about a tenth of each
relayed request's CPU in a profile here (py-spy, 64 concurrent clients against a mock node) while adding
nothing these two routes use: they read their own body, validate it with the protocol models and answer
through `handle`. This lane runs the same request-id and key-auth middlewares and the same error handlers
around the same `handle`; every other request (other paths, other methods) goes to the FastAPI app.
"""

from __future__ import annotations

import logging

from fastapi import FastAPI
from starlette.requests import Request
from starlette.types import Receive, Scope, Send

from tokenrelay.api.chat import ChatEndpoint
from tokenrelay.api.completions import CompletionsEndpoint
from tokenrelay.api.generation import Endpoint, handle
from tokenrelay.auth.middleware import KeyAuthMiddleware
from tokenrelay.errors import APIError, error_response
from tokenrelay.requestid import RequestIdMiddleware

log = logging.getLogger(__name__)


class GenerationLane:
    """Serves the two generation routes; the rest of the app sits behind it."""

    def __init__(self, app: FastAPI) -> None:
        self.app = app
        self.endpoints: dict[str, Endpoint] = {
            "/v1/chat/completions": ChatEndpoint(),
            "/v1/completions": CompletionsEndpoint(),
        }
        self.lane = RequestIdMiddleware(KeyAuthMiddleware(self._serve))

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] == "POST" and scope["path"] in self.endpoints:
            scope["app"] = self.app  # what Starlette sets: the middlewares and `handle` find the services there
            await self.lane(scope, receive, send)
            return
        await self.app(scope, receive, send)

    async def _serve(self, scope: Scope, receive: Receive, send: Send) -> None:
        request = Request(scope, receive)
        try:
            response = await handle(request, self.endpoints[scope["path"]])
        except APIError as exc:
            response = error_response(exc)
        except Exception:  # the same answer FastAPI's handler gives: an OpenAI error body, details in the log
            log.exception("unhandled error on %s", scope["path"])
            response = error_response(APIError("The server had an error while processing your request."))
        await response(scope, receive, send)
