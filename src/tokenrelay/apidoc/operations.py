"""Operation pieces built from the pydantic models that validate the bodies: a route declares its body with
`json_body(Model)` and, when it generates, its answers with `answers(...)`.

The schemas travel with the operation under `COMPONENTS` (an extension key); `document.py` moves them to
`components/schemas`, so each body is one named schema, and the models nested in it sit in its `$defs`.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from tokenrelay.apidoc.errors import OpenAIError, error_responses

COMPONENTS = "x-tokenrelay-components"
SSE = "text/event-stream"
# One server-sent event of a streamed answer: its `data` is a JSON payload (or chat's and completions'
# closing `[DONE]`); the Responses and Messages streams name each event after its payload's `type`.
SSE_EVENT = {
    "type": "object",
    "required": ["data"],
    "properties": {"event": {"type": "string"}, "data": {"type": "string"}},
}


def component_ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{name}"}


def model_schema(model: type[BaseModel]) -> dict[str, Any]:
    """The request model's validation schema, its nested models referenced where the document will hold them."""
    name = model.__name__
    return model.model_json_schema(ref_template=f"#/components/schemas/{name}/$defs/{{model}}", mode="validation")


def flat_schemas(model: type[BaseModel]) -> dict[str, Any]:
    """`model` and the models in it as components of their own (as FastAPI lists a response model)."""
    schema = model.model_json_schema(ref_template="#/components/schemas/{model}")
    return {model.__name__: schema, **schema.pop("$defs", {})}


def json_body(model: type[BaseModel], *, description: str | None = None) -> dict[str, Any]:
    """A FastAPI `openapi_extra` declaring a required JSON body that `model` validates."""
    body: dict[str, Any] = {
        "required": True,
        "content": {"application/json": {"schema": component_ref(model.__name__)}},
    }
    if description:
        body["description"] = description
    return {"requestBody": body, COMPONENTS: {model.__name__: model_schema(model)}}


def answers(
    answer: str,
    statuses: tuple[int, ...],
    *,
    error_body: type[BaseModel] = OpenAIError,
    streams: bool = True,
) -> dict[int | str, dict[str, Any]]:
    """FastAPI `responses=` of a generating route: a JSON object (or, when it `streams`, server-sent events),
    and each of `statuses` with the API's error body."""
    success: dict[str, Any] = {"application/json": {"schema": {"type": "object"}}}
    if streams:
        success[SSE] = {"schema": SSE_EVENT}
    return {200: {"description": answer, "content": success}, **error_responses(*statuses, body=error_body)}
