"""Fallbacks of natively relayed requests (`backends/fallback.py`): only to a model whose nodes serve the same API
themselves, so the client still gets a node's own answer; a request continuing a response kept on one node stays."""

from __future__ import annotations

import json

import pytest
from aiohttp import web
from upstream_fakes import ON_ASYNCIO, REFUSE, FakeNodes, answer, chat, drain, nodes_fixture

from tokenrelay.backends.base import NativeRequest, Raw, Served
from tokenrelay.backends.fallback import FallbackBackend, Fallbacks
from tokenrelay.config import ModelSettings
from tokenrelay.errors import APIError

pytestmark = ON_ASYNCIO
nodes = nodes_fixture()

NATIVE = {"native_apis": ["responses"]}
RESPONSE = {"id": "resp_node", "object": "response", "status": "completed", "model": "node-model", "output": []}


def relaying(nodes: FakeNodes) -> FallbackBackend:
    """`asked` on a dead node that relays Responses; its fallbacks: `plain` (chat only), then `native`."""
    nodes.on("dead", REFUSE)
    nodes.on("plain", answer(lambda: web.json_response(RESPONSE)))
    nodes.on("native", answer(lambda: web.json_response(RESPONSE)))
    backends = {"plain": nodes.backend("plain"), "native": nodes.backend("native", **NATIVE)}
    url = {"upstreams": [{"url": "http://127.0.0.1:1/v1"}]}
    settings = {
        "asked": ModelSettings(id="asked", fallbacks=["plain", "native"], **url),  # type: ignore[arg-type]
        "plain": ModelSettings(id="plain", **url),  # type: ignore[arg-type]
        "native": ModelSettings(id="native", **url),  # type: ignore[arg-type]
    }
    fallbacks = Fallbacks(settings.get, backends.get, lambda model: True)  # type: ignore[arg-type]
    return FallbackBackend("asked", nodes.backend("dead", **NATIVE), fallbacks)


def responses(node: str | None = None) -> NativeRequest:
    """A Responses request; `node`: the node that keeps the response it continues."""
    return NativeRequest("responses", {"model": "asked", "input": "Hi"}, chat("Hi"), node=node)


async def test_a_relay_falls_back_only_to_a_model_relaying_the_same_api(nodes: FakeNodes) -> None:
    backend = relaying(nodes)
    assert backend.relays("responses") and not backend.relays("messages")
    events = await drain(backend.relay(responses(), "rid"))
    assert json.loads(b"".join(e.data for e in events if isinstance(e, Raw))) == RESPONSE
    assert [(e.node, e.model) for e in events if isinstance(e, Served)] == [("native", "native")]
    assert nodes.hits("plain") == 0  # it would have answered, but through chat: not the API the client asked for


async def test_a_relay_continuing_a_response_kept_on_a_node_does_not_fall_back(nodes: FakeNodes) -> None:
    backend = relaying(nodes)
    with pytest.raises(APIError):
        await drain(backend.relay(responses(node="dead"), "rid"))
    assert nodes.hits("native") == 0
