"""Routes whose endpoint is its own request handler: it takes the `Request` and answers with a `Response`, reading
and validating its own body (with the API's 400s, never FastAPI's 422s)."""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import Any

from fastapi.routing import APIRoute
from starlette.requests import Request
from starlette.responses import Response

# A direct route's endpoint: the request in, its response out.
Handler = Callable[[Request], Coroutine[Any, Any, Response]]


class DirectRoute(APIRoute):
    """FastAPI matches and documents the route, and solves no parameters for a function that has none to solve
    (FastAPI's documented extension: a custom `route_class` overriding `get_route_handler`). The server's
    `Gate` serves these routes' POSTs straight from `handler`."""

    def get_route_handler(self) -> Handler:
        return self.handler

    @property
    def handler(self) -> Handler:
        handler: Handler = self.endpoint
        return handler
