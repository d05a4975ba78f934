"""Small helpers shared by the end-to-end tests."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import jsonschema

SCHEMAS = Path(__file__).parent / "schemas"
MODEL = "gemma-3-270m"
CHAT_MODEL = "smollm2-135m-instruct"


def validate(body: dict[str, Any], schema_name: str) -> None:
    schema = json.loads((SCHEMAS / f"{schema_name}.schema.json").read_text())
    jsonschema.validate(body, schema)


def sse_events(http: httpx.Client, path: str, body: dict[str, Any]) -> list[str]:
    """Raw `data:` payloads of a streamed response, in order (including the final `[DONE]`)."""
    with http.stream("POST", path, json=body) as response:
        assert response.status_code == 200, response.read()
        assert response.headers["content-type"] == "text/event-stream; charset=utf-8"
        assert response.headers["cache-control"] == "no-cache"  # no proxy or browser cache keeps a stream
        assert response.headers["x-accel-buffering"] == "no"  # nor does nginx buffer it
        assert response.headers["x-request-id"]
        return [line[len("data: ") :] for line in response.iter_lines() if line.startswith("data: ")]


def chunks(events: list[str]) -> list[dict[str, Any]]:
    assert events[-1] == "[DONE]"
    return [json.loads(e) for e in events[:-1]]


def user(text: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": text}]
