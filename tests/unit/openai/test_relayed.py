"""`/v1/responses` and `/v1/messages` over nodes that serve them natively: the client gets the node's own answer,
node errors in the API's shape, and the call is recorded with the node's usage."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from aiohttp import web
from upstream_fakes import ON_ASYNCIO, FakeNodes, Stream, answer, error, nodes_fixture

from tokenrelay.backends.upstream.backend import RoutedBackend
from tokenrelay.calls.record import Call
from tokenrelay.config import Settings
from tokenrelay.errors import AuthenticationError, ModelNotFound
from tokenrelay.principal import ANONYMOUS, Principal
from tokenrelay.server.app import create_app
from tokenrelay.store.responses import StoredResponse

pytestmark = ON_ASYNCIO
nodes = nodes_fixture()

RESPONSE = {
    "id": "resp_node",
    "object": "response",
    "status": "completed",
    "error": None,
    "output": [{"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Hi!"}]}],
    "usage": {"input_tokens": 7, "output_tokens": 2, "input_tokens_details": {"cached_tokens": 0}},
}
MESSAGE_STREAM = (
    b'event: message_start\ndata: {"type":"message_start","message":{"id":"msg_node","usage":'
    b'{"input_tokens":5,"cache_read_input_tokens":2,"output_tokens":1}}}\n\n'
    b'event: content_block_delta\ndata: {"type":"content_block_delta","index":0,'
    b'"delta":{"type":"text_delta","text":"Hi"}}\n\n'
    b'event: message_delta\ndata: {"type":"message_delta","delta":{"stop_reason":"end_turn"},'
    b'"usage":{"output_tokens":4}}\n\n'
    b'event: message_stop\ndata: {"type":"message_stop"}\n\n'
)


class OneKey:
    async def authenticate(self, token: str | None) -> Principal:
        if token != "the-key":
            raise AuthenticationError("Incorrect API key provided.")
        return ANONYMOUS


class KeptHere:
    """The gateway's response store, in memory: what it knows of the responses nodes keep."""

    def __init__(self) -> None:
        self.relayed: dict[str, StoredResponse] = {}

    async def get(self, response_id: str, key_id: str | None) -> StoredResponse | None:
        return self.relayed.get(response_id)

    async def put(self, *args: Any, **kwargs: Any) -> None:
        raise AssertionError("a native relay stored a response's contents")

    async def put_relayed(self, response_id: str, key_id: str | None, model: str, node: str) -> None:
        self.relayed[response_id] = StoredResponse({"id": response_id}, [], [], model, node)

    async def delete(self, response_id: str, key_id: str | None) -> bool:
        return self.relayed.pop(response_id, None) is not None


class FakeServices:
    """The part of `Services` the two routes use, over one routed model."""

    def __init__(self, backend: RoutedBackend) -> None:
        self.verifier = OneKey()
        self.routed = backend
        self.responses = KeptHere()
        self.ended: list[Call] = []

    def begin_call(self, call: Call, request: object) -> None:
        call.principal = ANONYMOUS

    async def admit(self, call: Call, body: Any) -> RoutedBackend:
        return await self.backend(body.model)

    async def backend(self, model: str) -> RoutedBackend:
        if model != "m":
            raise ModelNotFound(model)
        return self.routed

    def end_call(self, call: Call) -> None:
        self.ended.append(call)


@pytest.fixture
async def client(nodes: FakeNodes, tmp_path: Path) -> AsyncIterator[tuple[httpx.AsyncClient, FakeServices]]:
    app = create_app(Settings(data_dir=str(tmp_path), models=[]))
    services = FakeServices(nodes.backend("a", model="node-model", native_apis=["responses", "messages"]))
    app.state.services = services  # no lifespan: nothing else is needed here
    headers = {"Authorization": "Bearer the-key", "x-api-key": "the-key", "anthropic-version": "2023-06-01"}
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t", headers=headers) as c:
        yield c, services


async def test_a_response_is_the_nodes_and_only_its_holder_is_remembered(
    nodes: FakeNodes, client: tuple[httpx.AsyncClient, FakeServices]
) -> None:
    http, services = client
    nodes.on("a", answer(lambda: web.json_response(RESPONSE)))
    body = {"model": "m", "input": "Hello", "max_output_tokens": 8}
    response = await http.post("/v1/responses", json=body)
    assert response.status_code == 200 and response.json() == RESPONSE
    assert nodes.bodies("a") == [body | {"model": "node-model"}]
    [call] = services.ended
    assert (call.endpoint, call.model, call.node) == ("responses", "m", "a")
    assert (call.usage.prompt_tokens, call.usage.completion_tokens, call.usage.estimated) == (7, 2, False)
    assert services.responses.relayed["resp_node"] == StoredResponse({"id": "resp_node"}, [], [], "m", "a")


async def test_a_continued_response_goes_to_the_node_that_keeps_it(
    nodes: FakeNodes, client: tuple[httpx.AsyncClient, FakeServices]
) -> None:
    http, services = client
    services.routed = nodes.backend("a", "b", model="node-model", native_apis=["responses"])
    await services.responses.put_relayed("resp_earlier", None, "m", "b")
    for name in ("a", "b"):
        nodes.on(name, answer(lambda: web.json_response(RESPONSE | {"store": False})))
    body = {"model": "m", "input": "Hello", "previous_response_id": "resp_earlier"}
    for _ in range(3):
        assert (await http.post("/v1/responses", json=body)).status_code == 200
    assert nodes.bodies("a") == [] and nodes.bodies("b") == [body | {"model": "node-model"}] * 3
    missing = await http.post("/v1/responses", json=body | {"previous_response_id": "resp_elsewhere"})
    assert missing.status_code == 404 and missing.json()["error"]["param"] == "previous_response_id"


async def test_reads_of_a_kept_response_are_forwarded_to_its_node(
    nodes: FakeNodes, client: tuple[httpx.AsyncClient, FakeServices]
) -> None:
    http, services = client
    services.routed = nodes.backend("a", "b", model="node-model", native_apis=["responses"])
    await services.responses.put_relayed("resp_node", None, "m", "b")
    items = {"object": "list", "data": [], "first_id": None, "last_id": None, "has_more": False}
    deleted = {"id": "resp_node", "object": "response", "deleted": True}

    async def node_b(request: web.Request) -> web.Response:
        if request.path.endswith("/input_items"):
            return web.json_response(items)
        return web.json_response(deleted if request.method == "DELETE" else RESPONSE)

    nodes.on("b", node_b)
    assert (await http.get("/v1/responses/resp_node")).json() == RESPONSE
    listed = await http.get("/v1/responses/resp_node/input_items", params={"limit": 5, "order": "asc", "after": "x"})
    assert listed.json() == items
    assert (await http.delete("/v1/responses/resp_node")).json() == deleted
    assert [(seen.node, seen.method, seen.path) for seen in nodes.seen] == [
        ("b", "GET", "/b/v1/responses/resp_node"),
        ("b", "GET", "/b/v1/responses/resp_node/input_items?limit=5&order=asc&after=x"),
        ("b", "DELETE", "/b/v1/responses/resp_node"),
    ]
    assert "resp_node" not in services.responses.relayed
    assert (await http.get("/v1/responses/resp_node")).status_code == 404


@pytest.mark.parametrize(("node_status", "status"), [(404, 404), (500, 502)])
async def test_a_kept_response_the_node_cannot_give_is_a_404_or_a_502(
    nodes: FakeNodes, client: tuple[httpx.AsyncClient, FakeServices], node_status: int, status: int
) -> None:
    http, services = client
    await services.responses.put_relayed("resp_node", None, "m", "a")
    nodes.on("a", answer(lambda: error(node_status, "no")))
    response = await http.get("/v1/responses/resp_node")
    assert response.status_code == status and set(response.json()["error"]) == {"message", "type", "param", "code"}
    await services.responses.put_relayed("resp_gone", None, "m", "no-such-node")
    assert (await http.get("/v1/responses/resp_gone")).status_code == 502


async def test_a_message_stream_is_the_nodes_bytes(
    nodes: FakeNodes, client: tuple[httpx.AsyncClient, FakeServices]
) -> None:
    http, services = client
    nodes.on("a", Stream([MESSAGE_STREAM[:50], MESSAGE_STREAM[50:]]).respond)
    body = {"model": "m", "max_tokens": 8, "stream": True, "messages": [{"role": "user", "content": "Hi"}]}
    response = await http.post("/v1/messages", json=body, headers={"anthropic-beta": "some-beta"})
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/event-stream")
    assert response.content == MESSAGE_STREAM
    [seen] = nodes.seen
    assert seen.headers["anthropic-version"] == "2023-06-01" and seen.headers["anthropic-beta"] == "some-beta"
    [call] = services.ended
    assert (call.endpoint, call.streamed, call.status) == ("messages", True, 200)
    assert (call.usage.prompt_tokens, call.usage.cached_tokens, call.usage.completion_tokens) == (7, 2, 4)


async def test_a_nodes_400_reaches_a_responses_client_in_openais_shape(
    nodes: FakeNodes, client: tuple[httpx.AsyncClient, FakeServices]
) -> None:
    http, services = client
    nodes.on("a", answer(lambda: error(400, "too many tokens", param="max_output_tokens", code="invalid_value")))
    response = await http.post("/v1/responses", json={"model": "m", "input": "Hello"})
    assert response.status_code == 400
    assert response.json()["error"] == {
        "message": "too many tokens",
        "type": "invalid_request_error",
        "param": "max_output_tokens",
        "code": "invalid_value",
    }
    [call] = services.ended
    assert call.status == 400


async def test_a_nodes_400_reaches_a_messages_client_in_anthropics_shape(
    nodes: FakeNodes, client: tuple[httpx.AsyncClient, FakeServices]
) -> None:
    http, _ = client
    anthropic_error = {"type": "error", "error": {"type": "invalid_request_error", "message": "max_tokens: too large"}}
    nodes.on("a", answer(lambda: web.json_response(anthropic_error, status=400)))
    body = {"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "Hi"}]}
    response = await http.post("/v1/messages", json=body)
    assert response.status_code == 400 and response.json() == anthropic_error


async def test_a_stream_that_breaks_ends_with_the_apis_error_event(
    nodes: FakeNodes, client: tuple[httpx.AsyncClient, FakeServices]
) -> None:
    http, services = client
    first = b'event: response.created\ndata: {"type":"response.created","sequence_number":0}\n\n'
    nodes.on("a", Stream([first]).respond)  # ends without response.completed
    response = await http.post("/v1/responses", json={"model": "m", "input": "Hello", "stream": True})
    assert response.content.startswith(first)
    name, data = response.content[len(first) :].decode().strip().split("\n")
    assert name == "event: error"
    assert json.loads(data.removeprefix("data: "))["type"] == "error"
    [call] = services.ended
    assert call.status == 502 and call.usage.estimated
