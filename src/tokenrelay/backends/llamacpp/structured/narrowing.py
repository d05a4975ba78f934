"""A schema as it is generated: compact, and narrowed where it would let a model run away.

Every narrowing keeps output inside what the schema allows, so the output still validates against the schema
the client sent.
"""

from __future__ import annotations

from typing import Any

# Compact JSON: no whitespace between tokens. A base model given the choice emits newlines and indentation
# forever inside an object; without whitespace every token advances the value, so a small object finishes well
# inside max_tokens. A schema may still ask for other layout through llguidance's own `x-guidance` key.
COMPACT: dict[str, Any] = {"whitespace_flexible": False, "item_separator": ",", "key_separator": ":"}

# RFC 8259 section 6: integers in this range are the ones JSON implementations agree on.
SAFE_INT_MIN, SAFE_INT_MAX = -(2**53) + 1, 2**53 - 1
DECIMAL_STEP = 1e-10  # finer steps exceed what llguidance's multipleOf can represent

OPEN_OBJECT_KEYS = ("additionalProperties", "patternProperties", "unevaluatedProperties")
COMBINING_KEYS = ("allOf", "anyOf", "oneOf", "$ref")
SCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")
SCHEMA_LISTS = ("anyOf", "oneOf", "prefixItems", "items")
SCHEMA_VALUES = ("items", "additionalProperties", "additionalItems", "contains", "propertyNames", "not")


def generation_schema(schema: dict[str, Any]) -> dict[str, Any]:
    """The schema as generated: compact layout by default (the schema's own `x-guidance` options win), objects
    closed to undeclared properties, numbers bounded.

    The narrowings keep a base model from running away where the schema leaves it room: on the default model,
    open objects kept gaining invented properties, and integers and fractions kept gaining digits, until
    max_tokens (llama.cpp's own schema converter caps digits for the same reason). The output is a subset of
    what the schema allows, so it still validates against the schema as sent; a schema that wants more says
    so (`additionalProperties: true`, its own `minimum`/`maximum`/`multipleOf`).
    """
    options = schema.get("x-guidance")
    own = options if isinstance(options, dict) else {}
    return narrowed(schema) | {"x-guidance": COMPACT | own}


def narrowed(schema: Any) -> Any:
    """`schema` and its subschemas with `_close` and `_bound` applied.

    Objects combined with `allOf`/`anyOf`/`oneOf`/`$ref` stay open (closing one part would forbid the
    properties another declares), and everything under `allOf` is left as it is, for the same reason.
    """
    if not isinstance(schema, dict):
        return schema
    out = dict(schema)
    for key in SCHEMA_MAPS:
        if isinstance(out.get(key), dict):
            out[key] = {name: narrowed(sub) for name, sub in out[key].items()}
    for key in SCHEMA_LISTS:
        if isinstance(out.get(key), list):
            out[key] = [narrowed(sub) for sub in out[key]]
    for key in SCHEMA_VALUES:
        if isinstance(out.get(key), dict):
            out[key] = narrowed(out[key])
    _close(out)
    _bound(out)
    return out


def _close(schema: dict[str, Any]) -> None:
    """Objects that declare `properties` and say nothing about others get `additionalProperties: false`
    (as OpenAI's strict mode and xgrammar's do)."""
    if _closable(schema):
        schema["additionalProperties"] = False


def _bound(schema: dict[str, Any]) -> None:
    """Numbers without bounds stay within JSON's interoperable integer range (what a double holds exactly), and
    non-integers are written in plain decimals with at most ten places (no exponent).

    A default bound is only added where it leaves the schema satisfiable: never beside `enum`/`const`, nor
    against a bound of the schema's own that lies outside the range.
    """
    kind = schema.get("type")
    kinds = kind if isinstance(kind, list) else [kind]
    if ("integer" not in kinds and "number" not in kinds) or "enum" in schema or "const" in schema:
        return
    if "number" in kinds and "multipleOf" not in schema:
        schema["multipleOf"] = DECIMAL_STEP
    lowest = schema.get("minimum", schema.get("exclusiveMinimum"))
    highest = schema.get("maximum", schema.get("exclusiveMaximum"))
    if lowest is None and (highest is None or highest >= SAFE_INT_MIN):
        schema["minimum"] = SAFE_INT_MIN
    if highest is None and (lowest is None or lowest <= SAFE_INT_MAX):
        schema["maximum"] = SAFE_INT_MAX


def _closable(schema: dict[str, Any]) -> bool:
    declared = schema.get("properties")
    return (
        isinstance(declared, dict)
        and not any(key in schema for key in (*OPEN_OBJECT_KEYS, *COMBINING_KEYS))
        and all(name in declared for name in schema.get("required", []))
    )
