"""What coding agents send, replayed against a real server.

The bodies and headers in `tests/support/agents/` were recorded from Codex CLI 0.171 (`codex exec`, Responses API,
default settings) and Claude Code 2.1 (`claude -p`, Messages API), each a first turn and the turn after a tool
ran. They are sent as recorded, except for `max_output_tokens`, added so that a test's generation is bounded.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx
import pytest
import yaml
from accounting_support import sqlite_url
from servers import Server, start_server

AGENTS = Path(__file__).resolve().parents[1] / "support" / "agents"
CODEX_MODEL = "smollm2-135m-instruct"
CLAUDE_MODEL = "gemma-3-270m"
# Codex's instructions and tools come to about 9,000 of SmolLM2's tokens (more than its trained 8,192, so its long
# slot is made longer); Claude Code's prompt to about 21,000 of Gemma's, more than this context holds.
CONTEXT = "16384"


def recorded(name: str) -> dict[str, Any]:
    record: dict[str, Any] = json.loads((AGENTS / f"{name}.json").read_text())
    return record


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    server = start_server(tmp_path_factory.mktemp("agents"), "--max-context", CONTEXT)
    yield server
    server.stop()


@pytest.fixture(scope="module")
def front(engine: Server, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """A gateway whose chat model is the engine's, relayed over chat."""
    tmp = tmp_path_factory.mktemp("front")
    node = {"url": f"{engine.base_url}/v1", "name": "engine", "model": CODEX_MODEL}
    config = tmp / "front.yaml"
    config.write_text(yaml.safe_dump({"models": [{"id": CODEX_MODEL, "upstreams": [node]}]}))
    server = start_server(tmp, "--config", str(config), "--database-url", sqlite_url(tmp))
    yield server
    server.stop()


def replay(server: Server, record: dict[str, Any], **fields: Any) -> tuple[httpx.Response, str]:
    headers = {name: value for name, value in record["headers"].items() if name.lower() != "content-type"}
    body = record["body"] | fields
    with (
        httpx.Client(base_url=server.base_url, timeout=900) as http,
        http.stream("POST", record["path"], params=record["query"], headers=headers, json=body) as response,
    ):
        return response, response.read().decode()


def named_events(text: str) -> list[tuple[str, dict[str, Any]]]:
    """The stream's events, each checked to be named after its payload's type."""
    events = []
    for block in filter(str.strip, text.split("\n\n")):
        name, data = re.fullmatch(r"event: (\S+)\ndata: (.*)", block.strip(), re.S).groups()  # type: ignore[union-attr]
        payload = json.loads(data)
        assert payload["type"] == name
        events.append((name, payload))
    return events


def ignored(response: httpx.Response) -> set[str]:
    return set(response.headers.get("x-tokenrelay-ignored-fields", "").split(", "))


@pytest.mark.parametrize("via", ["engine", "front"])
def test_codex_turns_stream_to_their_end(via: str, request: pytest.FixtureRequest) -> None:
    server: Server = request.getfixturevalue(via)
    for turn in ("turn1", "turn2"):
        record = recorded(f"codex-0.171-{turn}")
        response, text = replay(server, record, max_output_tokens=24)
        assert response.status_code == 200, text
        events = named_events(text)
        # Cut at max_output_tokens, a response ends `incomplete`, as OpenAI's do.
        assert events[0][0] == "response.created" and events[-1][0] in ("response.completed", "response.incomplete")
        assert [payload["sequence_number"] for _, payload in events] == list(range(len(events)))
        done = events[-1][1]["response"]
        assert done["status"] in ("completed", "incomplete") and done["usage"]["input_tokens"] > 5000
        # Its hints and the hosted web search tool are accepted, and named; nothing else is.
        assert ignored(response) == {"client_metadata", "include", "reasoning", "tools.8"}
        sent = {tool.get("name") for tool in record["body"]["tools"]}
        namespaces = {tool["name"]: tool for tool in record["body"]["tools"] if tool["type"] == "namespace"}
        for item in done["output"]:
            if item["type"] == "function_call":
                space = item.get("namespace")
                known = sent if space is None else {tool["name"] for tool in namespaces[space]["tools"]}
                assert item["name"] in known


def test_claude_codes_prompt_over_the_context_is_refused_in_anthropics_words(engine: Server) -> None:
    """Claude Code compacts its conversation when told `prompt is too long: N tokens > M maximum`."""
    record = recorded("claude-code-2.1-turn1")
    response, text = replay(engine, record)
    assert response.status_code == 400, text
    error = json.loads(text)
    assert error["type"] == "error" and error["error"]["type"] == "invalid_request_error"
    found = re.fullmatch(r"prompt is too long: (\d+) tokens > (\d+) maximum", error["error"]["message"])
    assert found is not None, error
    assert int(found[2]) == int(CONTEXT) - 1 < int(found[1])
    assert response.headers["request-id"] == response.headers["x-request-id"]
    # Counting the same prompt needs no grammar and no room in the context: it is the number the refusal gave.
    counted = httpx.post(f"{engine.base_url}/v1/messages/count_tokens", json=record["body"], timeout=300)
    assert counted.status_code == 200 and counted.json()["input_tokens"] == int(found[1])
    assert {"thinking", "context_management", "output_config.effort", "max_tokens"} <= ignored(counted)


def test_claude_codes_turns_stream_with_three_of_their_tools(engine: Server) -> None:
    """The recorded turns with three of their 24 tools (one whose schema uses `propertyNames`), so that the
    prompt fits: every field Claude Code sends is served or named, the system message inside the conversation
    is read where it stands, and the answer streams to its end."""
    for turn in ("turn1", "turn2"):
        record = recorded(f"claude-code-2.1-{turn}")
        body = record["body"]
        tools = [tool for tool in body["tools"] if tool["name"] in ("Bash", "Read", "TaskCreate")]
        response, text = replay(engine, record | {"body": body | {"max_tokens": 24, "tools": tools}})
        assert response.status_code == 200, text
        names = [name for name, _ in named_events(text)]
        assert names[0] == "message_start" and names[-1] == "message_stop"
        assert {"thinking", "context_management", "output_config.effort"} <= ignored(response)


def test_max_tokens_over_the_context_is_refused_with_the_numbers_claude_code_reads(engine: Server) -> None:
    """Claude Code asks for `max_tokens: 32000` and, told the sum is over the limit, asks again for less."""
    # A timeout of its own: without one the SDK refuses to wait for what 32000 tokens could take.
    client = anthropic.Anthropic(base_url=engine.base_url, api_key="none", max_retries=0, timeout=300)
    ask = [{"role": "user", "content": "Say hi."}]
    with pytest.raises(anthropic.BadRequestError) as caught:
        client.messages.create(model=CLAUDE_MODEL, max_tokens=32000, messages=ask)  # type: ignore[arg-type]
    message = caught.value.body["error"]["message"]  # type: ignore[index]
    found = re.fullmatch(r"input length and `max_tokens` exceed context limit: (\d+) \+ 32000 > (\d+), .*", message)
    assert found is not None and found[2] == CONTEXT
    room = int(found[2]) - int(found[1])
    answer = client.messages.create(model=CLAUDE_MODEL, max_tokens=min(room, 16), messages=ask)  # type: ignore[arg-type]
    assert answer.stop_reason in ("end_turn", "max_tokens")
