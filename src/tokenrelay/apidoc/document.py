"""The document served at `/openapi.json`: the app's routes, one set of components,
the key schemes, the statuses every authenticated route can answer with, and this server's own limits."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi

from tokenrelay import __version__
from tokenrelay.apidoc.errors import MEANING, OpenAIError
from tokenrelay.apidoc.operations import COMPONENTS, component_ref, flat_schemas
from tokenrelay.auth.caller import protected
from tokenrelay.config import Settings

DESCRIPTION = (
    "An OpenAI-compatible gateway (chat, completions, responses, embeddings) that also serves Anthropic's "
    "Messages API. Keys are needed once the first key exists or a static `api_key` is configured; until then "
    "the `/v1` routes are open."
)
SECURITY_SCHEMES = {
    "bearer": {"type": "http", "scheme": "bearer", "description": "`Authorization: Bearer <key>`"},
    "x-api-key": {"type": "apiKey", "in": "header", "name": "x-api-key", "description": "Anthropic's key header"},
}
# FastAPI's own 422 body: the routes validate their inputs themselves (or through the app's handler) and
# answer 400 with the API's error body instead.
FASTAPI_VALIDATION = ("HTTPValidationError", "ValidationError")


def install_document(app: FastAPI, settings: Settings) -> None:
    """Serve the full document at the app's `openapi_url`, built once on first request."""

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            app.openapi_schema = build_document(app, settings)
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]  # FastAPI's documented way to supply the document


def build_document(app: FastAPI, settings: Settings) -> dict[str, Any]:
    doc = get_openapi(title=app.title, version=__version__, description=DESCRIPTION, routes=app.routes)
    paths: dict[str, dict[str, Any]] = doc.setdefault("paths", {})
    components = doc.setdefault("components", {})
    schemas: dict[str, Any] = components.setdefault("schemas", {})
    for path, item in paths.items():
        for operation in item.values():
            for name, schema in operation.pop(COMPONENTS, {}).items():
                schemas.setdefault(name, schema)
            operation["responses"].pop("422", None)
            _secure(path, operation, settings)
    for name in FASTAPI_VALIDATION:
        schemas.pop(name, None)
    schemas.update({k: v for k, v in flat_schemas(OpenAIError).items() if k not in schemas})
    components["securitySchemes"] = SECURITY_SCHEMES
    for name in ("ChatCompletionRequest", "CompletionRequest"):
        _cap(schemas[name]["properties"]["n"], _most_choices(settings))
    _name_models(schemas, [model.id for model in settings.served_models()])
    for name in ANTHROPIC_BODIES:
        _without_discriminators(schemas[name])
    return doc


# Anthropic's bodies nest tagged unions three deep (messages, blocks, sources). Their `discriminator` hints are
# left out: every branch is still told apart by its `const` tag, and schemathesis's generator fails on the hints
# there ("Cannot generate an array with 1 demanded elements"), leaving the operations untested.
ANTHROPIC_BODIES = ("MessagesRequest", "CountTokensRequest")


def _without_discriminators(schema: Any) -> None:
    if isinstance(schema, dict):
        if isinstance(schema.get("discriminator"), dict) and "propertyName" in schema["discriminator"]:
            del schema["discriminator"]  # the keyword, not a property of that name
        for value in schema.values():
            _without_discriminators(value)
    elif isinstance(schema, list):
        for value in schema:
            _without_discriminators(value)


def _name_models(schemas: dict[str, Any], served: list[str]) -> None:
    """The models this server was started with, as examples of each request's `model` (models registered later
    are listed by `/v1/models`)."""
    for name, schema in schemas.items():
        model = schema.get("properties", {}).get("model")
        if name.endswith("Request") and model is not None:
            model["examples"] = served


def _secure(path: str, operation: dict[str, Any], settings: Settings) -> None:
    """The keys a route takes, and what the key check can answer (the route's own statuses are its own)."""
    if path.startswith("/v1/messages"):
        operation["security"] = [{"x-api-key": []}, {"bearer": []}, {}]
        return  # its errors are in Anthropic's shape, declared with the operation
    if protected(path):
        operation["security"] = [{"bearer": []}, {}]
        _declare(operation, 401, 503)
    elif path.startswith("/admin") or (path == "/metrics" and settings.metrics_require_admin):
        operation["security"] = [{"bearer": []}]
        _declare(operation, 401, 403, 503)
    _declare(operation, 500)


def _declare(operation: dict[str, Any], *statuses: int) -> None:
    content = {"application/json": {"schema": component_ref(OpenAIError.__name__)}}
    for status in statuses:
        operation["responses"].setdefault(str(status), {"description": MEANING[status], "content": content})


def _most_choices(settings: Settings) -> int:
    """`n` as every served model takes it: the embedded engine decodes at most `slots` sequences together."""
    slots = [settings.engine_for(model).slots for model in settings.served_models() if model.embedded]
    return min([settings.max_n, *slots])


def _cap(field: dict[str, Any], most: int) -> None:
    """Give an optional integer field this server's maximum."""
    for branch in field.get("anyOf", [field]):
        if branch.get("type") == "integer":
            branch["maximum"] = most
