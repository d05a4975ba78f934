"""A model served by its embedded engine and nodes together, and how the server builds such models."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from aiohttp import web
from upstream_fakes import ON_ASYNCIO, FakeNodes, answer, chat, chat_body, drain, nodes_fixture

from tokenrelay.backends.base import Event, Events, Finish, ModelCard, Served, TextDelta, Ticket, Usage
from tokenrelay.backends.upstream.backend import RoutedBackend
from tokenrelay.backends.upstream.members import EmbeddedMember
from tokenrelay.config import ModelSettings, RoutingSettings, Settings, UpstreamSettings
from tokenrelay.errors import InvalidRequest, Overloaded
from tokenrelay.server.services import Services

pytestmark = ON_ASYNCIO
nodes = nodes_fixture()


class Engine:
    """Stands in for the embedded engine: answers, or refuses the way the real one does."""

    kind = "llama.cpp"
    card = ModelCard(id="m", owned_by="tokenrelay", created=0)

    def __init__(self, refuse: Exception | None = None) -> None:
        self.refuse = refuse
        self.started = False
        self.calls = 0

    async def _answer(self) -> AsyncIterator[Events]:
        self.calls += 1
        if self.refuse is not None:
            raise self.refuse
        for event in (TextDelta(0, "local"), Finish(0, "stop"), Usage(2, 1)):
            yield [event]

    def chat(self, request: object, ticket: object) -> AsyncIterator[Events]:
        return self._answer()

    complete = chat

    def fingerprint(self) -> str:
        return "fp"

    async def start(self) -> None:
        self.started = True

    async def close(self) -> None:
        pass

    def ready(self) -> bool:
        return self.started

    def status(self) -> dict[str, object]:
        return {"backend": self.kind}


def mixed(nodes: FakeNodes, engine: Engine, capacity: int | None = None) -> RoutedBackend:
    nodes.on("b", answer(lambda: web.json_response(chat_body("remote"))))
    member = EmbeddedMember(engine, RoutingSettings(), capacity)
    backend = RoutedBackend("m", RoutingSettings(), [UpstreamSettings(url=nodes.url("b"), name="b")], embedded=member)
    nodes.backends.append(backend)
    return backend


def served(events: list[Event]) -> tuple[str, str]:
    return next((e.node, e.kind) for e in events if isinstance(e, Served))


async def test_engine_and_node_take_turns(nodes: FakeNodes) -> None:
    backend = mixed(nodes, Engine())
    await backend.start()
    answers = [await drain(backend.chat(chat(), Ticket("r"))) for _ in range(4)]
    assert [served(a) for a in answers] == [("embedded", "llama.cpp"), ("b", "upstream")] * 2
    assert backend.status()["embedded"]["requests"] == 2


async def test_a_busy_engine_hands_the_request_to_a_node(nodes: FakeNodes) -> None:
    engine = Engine(refuse=Overloaded("queue full"))
    backend = mixed(nodes, engine)
    events = await drain(backend.chat(chat(), Ticket("r")))
    assert served(events) == ("b", "upstream") and engine.calls == 1


async def test_an_engine_at_capacity_is_not_asked(nodes: FakeNodes) -> None:
    engine = Engine()
    backend = mixed(nodes, engine, capacity=1)
    backend.embedded.load.in_flight = 1  # one request already running there
    events = await drain(backend.chat(chat(), Ticket("r")))
    assert served(events) == ("b", "upstream") and engine.calls == 0


async def test_the_engines_own_400_reaches_the_client(nodes: FakeNodes) -> None:
    backend = mixed(nodes, Engine(refuse=InvalidRequest("`tools` is not supported", param="tools")))
    with pytest.raises(InvalidRequest, match="tools"):
        await drain(backend.chat(chat(), Ticket("r")))
    assert nodes.hits("b") == 0


async def test_services_build_a_mixed_model_and_register_nodes_at_run_time(tmp_path: Path) -> None:
    gguf = tmp_path / "model.gguf"
    gguf.write_bytes(b"GGUF")  # only stat()ed until the engine starts
    node = UpstreamSettings(url="http://127.0.0.1:9/v1", name="n")
    settings = Settings(models=[ModelSettings(id="mix", path=gguf, upstreams=[node])], data_dir=tmp_path)
    services = Services(settings)
    backend = services._backend_for(settings.models[0])
    assert isinstance(backend, RoutedBackend)
    assert backend.embedded is not None and backend.embedded.kind == "llama.cpp"
    assert list(backend.nodes) == ["n"] and not backend.dynamic

    engine = Engine()
    services.registry.add(engine)
    wrapped = await services.routed_backend("m")  # a node registers for a model served in-process so far
    assert wrapped.embedded is not None and wrapped.embedded.backend is engine and not wrapped.dynamic
    assert services.registry.get("m") is wrapped
    fresh = await services.routed_backend("new-model")
    assert fresh.dynamic and fresh.embedded is None and services.registry.get("new-model") is fresh
    assert await services.routed_backend("new-model") is fresh
    await services.close()
