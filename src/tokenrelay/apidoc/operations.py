"""Operation pieces built from the pydantic models that validate the bodies: a route declares its body with
`json_body(Model)`, a generation-lane route its whole operation with `lane_operation(...)`.

The schemas travel with the operation under `COMPONENTS` (an extension key); `document.py` moves them to
`components/schemas`, so each body is one named schema, and the models nested in it sit in its `$defs`.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from tokenrelay.apidoc.errors import MEANING, OpenAIError

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


def lane_operation(
    model: type[BaseModel],
    *,
    summary: str,
    answer: str,
    statuses: tuple[int, ...],
    error_body: type[BaseModel] = OpenAIError,
    streams: bool = True,
) -> dict[str, Any]:
    """The POST operation of a generation-lane route (which FastAPI does not see)."""
    success: dict[str, Any] = {"application/json": {"schema": {"type": "object"}}}
    if streams:
        success[SSE] = {"schema": SSE_EVENT}
    error_name = error_body.__name__
    errors = {
        str(status): {
            "description": MEANING[status],
            "content": {"application/json": {"schema": component_ref(error_name)}},
        }
        for status in statuses
    }
    operation = json_body(model)
    operation[COMPONENTS].update(flat_schemas(error_body))
    return {
        "summary": summary,
        "operationId": summary.lower().replace(" ", "_"),
        **operation,
        "responses": {"200": {"description": answer, "content": success}, **errors},
    }
