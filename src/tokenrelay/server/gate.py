"""The app's own middleware: what every HTTP request goes through before FastAPI's router.

It gives the request its id (`calls/request_ids.py`), authenticates its caller on the protected paths
(`auth/caller.py`) and answers a POST to a `DirectRoute` (chat, completions, embeddings, Messages) straight from
the route's endpoint: that endpoint reads its own body and answers with its own `Response`, so FastAPI's router and
per-route layers (route matching over every route, exception and exit-stack wrappers, dependency bookkeeping) would
add about a third more of the gateway's own work to a relayed request and nothing it uses. One middleware rather
than one per step, so a response the gate makes itself (those answers, a refusal, an error in the path's dialect as
the app's handlers write it) carries the id in its own headers; only what goes on to FastAPI (every other path and
method, e.g. a 405 naming POST) has `send` wrapped to add it. The routes stay FastAPI's: declared once in their
routers, documented by FastAPI.
"""

from __future__ import annotations

from collections.abc import Iterable

from fastapi import APIRouter
from starlette.requests import Request
from starlette.types import ASGIApp, Receive, Scope, Send

from tokenrelay.api.direct_route import DirectRoute, Handler
from tokenrelay.api.server import services_of
from tokenrelay.auth.caller import authenticate, protected
from tokenrelay.auth.dialects import Dialects
from tokenrelay.calls.request_ids import assign_request_id, sending_id
from tokenrelay.server.failures import failure_response


class Gate:
    """Request ids, the key check and the `DirectRoute`s of `routers` (included in the app without a prefix)."""

    def __init__(self, app: ASGIApp, dialects: Dialects, routers: Iterable[APIRouter]) -> None:
        self.app = app
        self.dialects = dialects
        self.direct: dict[str, Handler] = {
            route.path: route.handler for router in routers for route in router.routes if isinstance(route, DirectRoute)
        }

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request_id = assign_request_id(scope)
        handler = self.direct.get(scope["path"]) if scope["method"] == "POST" else None
        try:
            if protected(scope["path"]):
                await authenticate(scope, self.dialects, services_of(scope).verifier)
            response = None if handler is None else await handler(Request(scope, receive))
        except Exception as exc:  # a refusal, or a direct route's failure
            response = failure_response(self.dialects, scope["path"], exc)
        if response is None:  # FastAPI answers
            await self.app(scope, receive, sending_id(send, request_id))
            return
        response.raw_headers.extend(self.dialects.of(scope["path"]).id_headers(request_id))
        await response(scope, receive, send)
