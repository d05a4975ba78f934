"""Structured outputs (`response_format`) on the embedded engine with the default model."""

from __future__ import annotations

import concurrent.futures
import json
import math
from typing import Any

import jsonschema
import pytest
from helpers import MODEL, chunks, sse_events, user
from openai import BadRequestError, OpenAI

PERSON = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 30}, "age": {"type": "integer"}},
    "required": ["name", "age"],
    "additionalProperties": False,
}

# Varied on purpose: nesting, arrays with bounds, enums, consts, numbers with ranges, optional and required
# fields, $defs references, anyOf, nullable types, string formats and patterns.
SCHEMAS: list[dict[str, Any]] = [
    PERSON,
    {
        "type": "object",
        "properties": {
            "city": {"type": "string", "maxLength": 20},
            "location": {
                "type": "object",
                "properties": {
                    "lat": {"type": "number", "minimum": -90, "maximum": 90},
                    "lon": {"type": "number", "minimum": -180, "maximum": 180},
                },
                "required": ["lat", "lon"],
            },
        },
        "required": ["city", "location"],
    },
    {
        "type": "object",
        "properties": {
            "colour": {"enum": ["red", "green", "blue"]},
            "shade": {"type": "integer", "minimum": 0, "maximum": 9},
        },
        "required": ["colour", "shade"],
    },
    {
        "type": "object",
        "properties": {"fruits": {"type": "array", "items": {"enum": ["apple", "pear", "fig"]}, "maxItems": 4}},
        "required": ["fruits"],
    },
    {"type": "array", "items": {"type": "integer", "minimum": 1, "maximum": 100}, "minItems": 2, "maxItems": 5},
    {
        "type": "object",
        "properties": {
            "ok": {"type": "boolean"},
            "score": {"type": "number", "exclusiveMinimum": 0, "maximum": 1},
            "note": {"type": ["string", "null"], "maxLength": 12},
        },
        "required": ["ok", "score", "note"],
        "additionalProperties": False,
    },
    {
        "type": "object",
        "$defs": {"point": {"type": "object", "properties": {"x": {"type": "integer"}, "y": {"type": "integer"}}}},
        "properties": {"points": {"type": "array", "items": {"$ref": "#/$defs/point"}, "minItems": 1, "maxItems": 3}},
        "required": ["points"],
    },
    {
        "type": "object",
        "properties": {
            "kind": {"const": "event"},
            "date": {"type": "string", "format": "date"},
            "code": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{2}$"},
        },
        "required": ["kind", "date", "code"],
    },
    {
        "type": "object",
        "properties": {
            "answer": {
                "anyOf": [
                    {"type": "integer"},
                    {
                        "type": "object",
                        "properties": {"text": {"type": "string", "maxLength": 10}},
                        "required": ["text"],
                    },
                ]
            }
        },
        "required": ["answer"],
    },
    {
        "type": "object",
        "properties": {
            "user": {
                "type": "object",
                "properties": {
                    "id": {"type": "integer", "minimum": 1},
                    "roles": {
                        "type": "array",
                        "items": {"enum": ["admin", "dev", "ops"]},
                        "minItems": 1,
                        "maxItems": 2,
                    },
                    "profile": {
                        "type": "object",
                        "properties": {"nick": {"type": "string", "maxLength": 8}, "level": {"type": "integer"}},
                        "required": ["nick"],
                    },
                },
                "required": ["id", "roles", "profile"],
            }
        },
        "required": ["user"],
    },
]


def schema_format(schema: dict[str, Any], strict: bool | None = True) -> dict[str, Any]:
    return {"type": "json_schema", "json_schema": {"name": "answer", "schema": schema, "strict": strict}}


def ask(client: OpenAI, schema: dict[str, Any], seed: int, **kw: Any):
    return client.chat.completions.create(
        model=MODEL,
        messages=user("Reply with a JSON value for the requested record."),
        max_tokens=160,
        temperature=0.8,
        seed=seed,
        response_format=schema_format(schema),
        **kw,
    )


def test_fifty_seeded_schema_requests_all_validate(client: OpenAI) -> None:
    cases = [(schema, seed) for seed in range(5) for schema in SCHEMAS]
    with concurrent.futures.ThreadPoolExecutor(max_workers=8) as pool:
        replies = list(pool.map(lambda case: ask(client, *case), cases))
    assert len(replies) == 50
    for (schema, seed), reply in zip(cases, replies, strict=True):
        choice = reply.choices[0]
        assert choice.finish_reason == "stop", (seed, schema, choice.message.content)
        jsonschema.validate(json.loads(choice.message.content), schema)
    # Seeds matter: the same schema gives different values for different seeds.
    first = [r.choices[0].message.content for (s, _), r in zip(cases, replies, strict=True) if s is SCHEMAS[0]]
    assert len(set(first)) > 1


def test_output_is_compact_json(client: OpenAI) -> None:
    content = ask(client, SCHEMAS[9], seed=3).choices[0].message.content
    assert json.dumps(json.loads(content), separators=(",", ":"), ensure_ascii=False) == content


def test_seed_reproduces_constrained_output(client: OpenAI) -> None:
    assert (
        ask(client, PERSON, seed=11).choices[0].message.content
        == ask(client, PERSON, seed=11).choices[0].message.content
    )


def test_json_object_always_parses_to_an_object_unless_cut(client: OpenAI) -> None:
    prompts = [
        "Describe a cat as a JSON object with its name and colour.",
        "Give me a JSON object describing a city.",
        "Return a JSON object with keys a and b.",
        "Say hello.",  # not asking for JSON at all: still an object
        "List three colours as JSON.",
    ]

    def one(i: int):
        return client.chat.completions.create(
            model=MODEL,
            messages=user(prompts[i % len(prompts)]),
            max_tokens=120,
            temperature=0.9,
            seed=i,
            response_format={"type": "json_object"},
        )

    # Seeded outputs are the same on every run of this build (alone or together), so the count of non-empty
    # objects below is a fixed property of the build, not a matter of timing.
    replies = [one(i) for i in range(10)]
    objects = []
    for reply in replies:
        choice = reply.choices[0]
        if choice.finish_reason == "length":
            # A base model may count on inside an array the format leaves unbounded; then the answer is cut,
            # and says so. Nothing is truncated silently to make it parse.
            assert reply.usage.completion_tokens == 120
            continue
        assert choice.finish_reason == "stop"
        objects.append(json.loads(choice.message.content))
        assert isinstance(objects[-1], dict)
    # How many finish is the base model's business (its seeded outputs are fixed for a build and a CPU, not across
    # them); that some do, and that each that does is an object, is the contract's.
    assert objects


def test_streamed_schema_output_arrives_in_pieces_and_joins_to_valid_json(server) -> None:
    body = {
        "model": MODEL,
        "messages": user("A person, please."),
        "max_tokens": 80,
        "temperature": 0,
        "response_format": schema_format(PERSON),
        "stream": True,
    }
    with server.http() as http:
        events = chunks(sse_events(http, "/v1/chat/completions", body))
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in events if c["choices"])
    assert [c["choices"][0]["finish_reason"] for c in events if c["choices"]][-1] == "stop"
    assert len([c for c in events if c["choices"] and c["choices"][0]["delta"].get("content")]) > 3  # incremental
    jsonschema.validate(json.loads(text), PERSON)


def test_n_choices_share_a_schema_and_each_validates(client: OpenAI) -> None:
    reply = ask(client, SCHEMAS[2], seed=5, n=4)
    assert len(reply.choices) == 4
    for choice in reply.choices:
        assert choice.finish_reason == "stop"
        jsonschema.validate(json.loads(choice.message.content), SCHEMAS[2])
    assert len({c.message.content for c in reply.choices}) > 1


def test_cut_by_max_tokens_says_length(client: OpenAI) -> None:
    reply = client.chat.completions.create(
        model=MODEL,
        messages=user("A person."),
        max_tokens=3,
        temperature=0,
        response_format=schema_format(PERSON),
    )
    choice = reply.choices[0]
    assert choice.finish_reason == "length" and reply.usage.completion_tokens == 3
    with pytest.raises(json.JSONDecodeError):
        json.loads(choice.message.content)


def test_logprobs_describe_the_constrained_distribution(client: OpenAI) -> None:
    reply = client.chat.completions.create(
        model=MODEL,
        messages=user("A person."),
        max_tokens=40,
        temperature=0,
        logprobs=True,
        top_logprobs=3,
        response_format=schema_format(PERSON),
    )
    content = reply.choices[0].logprobs.content
    assert "".join(bytes(item.bytes).decode() for item in content) == reply.choices[0].message.content
    # The object's opening is forced: the only token the grammar allows, so it has probability 1 and no
    # alternatives; later positions list only tokens the grammar allowed there.
    assert content[0].token.startswith("{") and content[0].logprob == pytest.approx(0.0, abs=1e-4)
    assert [t.token for t in content[0].top_logprobs] == [content[0].token]
    assert all(math.isfinite(t.logprob) for item in content for t in item.top_logprobs)


BAD_FORMATS = [
    ({"type": "json_schema"}, "json_schema object"),
    (schema_format({"type": "strng"}), "not a valid JSON Schema"),
    (schema_format({"type": "object", "properties": {"a": {"type": "integer", "minimum": "low"}}}), "valid JSON"),
    (schema_format({"type": "array", "uniqueItems": True}), "uniqueItems"),
    (schema_format({"type": "object", "not": {"required": ["a"]}}), "not"),
    (schema_format({"type": "string", "format": "credit-card"}), "credit-card"),
    (schema_format({"type": "object", "if": {"required": ["a"]}, "then": {"required": ["b"]}}), '"if"'),
]


@pytest.mark.parametrize(("response_format", "named"), BAD_FORMATS)
def test_bad_or_unenforceable_schemas_are_400_naming_the_problem(
    client: OpenAI, response_format: dict[str, Any], named: str
) -> None:
    with pytest.raises(BadRequestError) as info:
        client.chat.completions.create(model=MODEL, messages=user("x"), max_tokens=4, response_format=response_format)
    error = info.value.body
    assert error["param"] == "response_format"
    assert named in error["message"]


def test_text_format_is_plain_generation(client: OpenAI) -> None:
    plain = client.chat.completions.create(model=MODEL, messages=user("Hi"), max_tokens=8, temperature=0)
    text = client.chat.completions.create(
        model=MODEL, messages=user("Hi"), max_tokens=8, temperature=0, response_format={"type": "text"}
    )
    assert plain.choices[0].message.content == text.choices[0].message.content
