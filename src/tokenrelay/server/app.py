"""The ASGI application: `create_app(settings)` builds everything in its lifespan."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI
from fastapi.exceptions import RequestValidationError
from fastapi.telemetry import TelemetryConfig
from opentelemetry.instrumentation.asgi import OpenTelemetryMiddleware
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Match

from tokenrelay import __version__
from tokenrelay.admin import metrics as metrics_route
from tokenrelay.admin import models as admin_models
from tokenrelay.admin import nodes as admin_nodes
from tokenrelay.admin import routes as admin_routes
from tokenrelay.anthropic.messages import router as messages
from tokenrelay.api.server import serve_with
from tokenrelay.apidoc.document import install_document
from tokenrelay.auth.dialects import Dialects
from tokenrelay.backends.upstream.http1 import Pool
from tokenrelay.backends.upstream.transport import TransportFactory
from tokenrelay.config import Settings
from tokenrelay.console import install_console
from tokenrelay.errors import INVALID_VALUE, APIError, InvalidRequest, NotFound
from tokenrelay.observability.tracing.setup import Tracing, tracing_for
from tokenrelay.openai import models, tokenize
from tokenrelay.openai.batches import router as batches
from tokenrelay.openai.chat import router as chat
from tokenrelay.openai.completions import router as completions
from tokenrelay.openai.embeddings import router as embeddings
from tokenrelay.openai.files import router as files
from tokenrelay.openai.responses import router as responses
from tokenrelay.server.announce import announce
from tokenrelay.server.failures import failure_response
from tokenrelay.server.gate import Gate
from tokenrelay.server.gc_tuning import tune_garbage_collector
from tokenrelay.server.services import Services

# The methods a 405's `Allow` can name: every method some route here may serve.
PROBED_METHODS = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS")


# Every API route, each from its endpoint's package.
ROUTERS = (
    chat,
    completions,
    responses,
    messages,
    embeddings,
    files,
    batches,
    models,
    tokenize,
    metrics_route,
    admin_routes,
    admin_nodes,
    admin_models,
)


def create_app(settings: Settings, transport: TransportFactory = Pool) -> FastAPI:
    """The app serving `settings`; its upstream nodes are reached through `transport` (a test's fake node)."""
    tracing = tracing_for(settings.telemetry)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        services = Services(settings, tracing=tracing, transport=transport)
        serve_with(app, services)
        try:
            await services.start()
            announce(settings.host, settings.port, services.registry.all())
            tune_garbage_collector()
            services.batch_runner.start(app)
            yield
        finally:
            await services.batch_runner.close(drain=settings.shutdown_timeout)
            await services.close()
            if tracing is not None:
                tracing.shutdown()  # the last spans go out before the process does

    # FastAPI's own OpenTelemetry hooks look up providers (and the environment) on every request; tokenrelay
    # does not use them.
    off: TelemetryConfig = {"tracing": False, "metrics": False, "logs": False}
    app = FastAPI(
        title="tokenrelay", version=__version__, lifespan=lifespan, docs_url=None, redoc_url=None, telemetry=off
    )
    dialects = Dialects({messages.PREFIX: messages.DIALECT})
    app.add_middleware(Gate, dialects=dialects, routers=[module.router for module in ROUTERS])
    if tracing is not None:
        add_tracing(app, tracing)  # outermost: the server span covers the whole call, refusals included
    for module in ROUTERS:
        app.include_router(module.router)
    install_console(app)
    install_error_handlers(app, dialects)
    install_document(app, settings)
    return app


def add_tracing(app: FastAPI, tracing: Tracing) -> None:
    """OpenTelemetry's ASGI instrumentation: one server span per API call, continuing an incoming `traceparent`;
    no spans of its own for each send and receive (a stream would make one per chunk)."""
    app.add_middleware(
        OpenTelemetryMiddleware,
        tracer_provider=tracing.provider,
        excluded_urls="/health,/metrics,/console,/openapi.json",
        exclude_spans=["receive", "send"],
    )


def install_error_handlers(app: FastAPI, dialects: Dialects) -> None:
    """Every failure as an error body in the shape of the path's API, never FastAPI's own bodies."""

    def error_response(request: Request, exc: Exception) -> Response:
        return failure_response(dialects, request.url.path, exc)

    @app.exception_handler(APIError)
    async def api_error(request: Request, exc: APIError) -> Response:
        return error_response(request, exc)

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, exc: HTTPException) -> Response:
        if exc.status_code == 404:
            return error_response(request, NotFound(f"Unknown path {request.url.path}."))
        headers = dict(exc.headers or {})
        message = str(exc.detail)
        if exc.status_code == 405:
            # Starlette names the methods of the first route on the path; a path may have several.
            headers["Allow"] = allowed = ", ".join(allowed_methods(app, request))
            message = f"{request.url.path} takes {allowed}, not {request.method}."
        return error_response(request, InvalidRequest(message, status=exc.status_code, headers=headers))

    @app.exception_handler(RequestValidationError)
    async def invalid_parameters(request: Request, exc: RequestValidationError) -> Response:
        # A query or path parameter FastAPI validated: the API's 400 naming it, not FastAPI's 422.
        first = exc.errors()[0]
        param = str(first["loc"][-1]) if first.get("loc") else None
        message = f"Invalid value for `{param}`: {first.get('msg', 'invalid value')}"
        return error_response(request, InvalidRequest(message, param=param, code=INVALID_VALUE))

    @app.exception_handler(Exception)
    async def unexpected(request: Request, exc: Exception) -> Response:
        return error_response(request, exc)


def allowed_methods(app: FastAPI, request: Request) -> list[str]:
    """Every method some route serves on the request's path: each one tried against the routes' own matching."""
    scope = {**request.scope, "root_path": ""}
    return [m for m in PROBED_METHODS if any(_serves(route, {**scope, "method": m}) for route in app.router.routes)]


def _serves(route: BaseRoute, scope: dict[str, Any]) -> bool:
    return route.matches(scope)[0] is Match.FULL
