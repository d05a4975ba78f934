"""The generating POST routes served straight from their endpoints, past FastAPI's router and per-route layers.

Those layers (route matching over every route, exception and exit-stack wrappers, dependency bookkeeping) cost a
relayed request about a third more of the gateway's own work, and a `DirectRoute`'s endpoint uses none of them: it
reads its own body and answers with its own `Response`. So this innermost middleware (inside the request-id and
key middlewares, which cover every path alike) answers a POST to such a route itself, with errors in the path's
dialect as the app's handlers write them; anything else goes on to FastAPI. The routes stay FastAPI's: declared
once in their routers, documented by FastAPI, and served by it for every other method (a 405 naming POST).
"""

from __future__ import annotations

from collections.abc import Iterable

from fastapi import APIRouter
from starlette.requests import Request
from starlette.types import ASGIApp, Receive, Scope, Send

from tokenrelay.auth.dialects import Dialects
from tokenrelay.openai.direct_route import DirectRoute
from tokenrelay.server.failures import failure_response


class FastPath:
    """Serves the `DirectRoute`s of `routers` (included in the app without a prefix)."""

    def __init__(self, app: ASGIApp, dialects: Dialects, routers: Iterable[APIRouter]) -> None:
        self.app = app
        self.dialects = dialects
        self.routes = {
            route.path: route for router in routers for route in router.routes if isinstance(route, DirectRoute)
        }

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        route = self.routes.get(scope["path"]) if scope["type"] == "http" and scope["method"] == "POST" else None
        if route is None:
            await self.app(scope, receive, send)
            return
        try:
            response = await route.handler(Request(scope, receive))
        except Exception as exc:
            response = failure_response(self.dialects, scope["path"], exc)
        await response(scope, receive, send)
