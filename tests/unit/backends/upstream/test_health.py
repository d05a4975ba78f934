"""The circuit breaker's states, probe health, and the probe loop against a node."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import pytest
from aiohttp import web
from upstream_fakes import ON_ASYNCIO, FakeNodes, answer, chat, chunk, drain, error, event_stream, nodes_fixture, sse

from tokenrelay.backends.base import Served, Ticket
from tokenrelay.backends.upstream.health import Breaker, BreakerState, ProbeHealth
from tokenrelay.config import RoutingSettings, UpstreamHealth
from tokenrelay.errors import APIError

nodes = nodes_fixture()


def on_asyncio(test: Callable[[], Awaitable[None]]) -> Callable[[], Awaitable[None]]:
    for mark in ON_ASYNCIO:
        test = mark(test)
    return test


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_breaker_opens_after_consecutive_failures_only() -> None:
    breaker = Breaker(threshold=3, cooldown=10, clock=Clock())
    breaker.failure()
    breaker.failure()
    breaker.success()
    breaker.failure()
    breaker.failure()
    assert breaker.state is BreakerState.CLOSED and breaker.allows()
    breaker.failure()
    assert breaker.state is BreakerState.OPEN and not breaker.allows()


def test_breaker_half_opens_after_cooldown_for_one_trial() -> None:
    clock = Clock()
    breaker = Breaker(threshold=1, cooldown=10, clock=clock)
    breaker.failure()
    clock.now = 9.9
    assert not breaker.allows()
    clock.now = 10.0
    assert breaker.state is BreakerState.HALF_OPEN and breaker.allows()
    breaker.begin()
    assert not breaker.allows()  # one trial at a time
    breaker.abandon()
    assert breaker.allows()  # the client left: the trial slot is free again


def test_a_failed_trial_reopens_and_a_good_one_closes() -> None:
    clock = Clock()
    breaker = Breaker(threshold=5, cooldown=10, clock=clock)
    for _ in range(5):
        breaker.failure()
    clock.now = 10
    breaker.begin()
    breaker.failure()
    assert breaker.state is BreakerState.OPEN
    clock.now = 20
    breaker.begin()
    breaker.success()
    assert breaker.state is BreakerState.CLOSED and breaker.failures == 0


def test_probe_health_needs_consecutive_failures_and_recovers_at_once() -> None:
    health = ProbeHealth(unhealthy_after=2)
    health.record(False)
    assert health.healthy
    health.record(False)
    assert not health.healthy
    health.record(True)
    assert health.healthy


@on_asyncio
async def test_breaker_opens_on_a_failing_node_and_recovers(nodes: FakeNodes) -> None:
    state = {"status": 500}

    def flaky() -> web.Response:
        if state["status"] != 200:
            return error(state["status"], "node trouble")
        return event_stream(sse(chunk("ok", finish="stop")))

    nodes.on("a", answer(flaky))
    nodes.on("b", answer(lambda: event_stream(sse(chunk("ok", finish="stop")))))
    routing = RoutingSettings(health=UpstreamHealth(breaker_failures=2, breaker_cooldown=0.2, probe_interval=0))
    backend = nodes.backend("a", "b", routing=routing)
    node = backend.nodes["a"]
    served = []
    for _ in range(6):
        served.append(
            next(e.node for e in await drain(backend.chat(chat(stream=True), Ticket("r"))) if isinstance(e, Served))
        )
    assert served == ["b"] * 6  # every request failed over
    assert nodes.hits("a") == 2 and node.breaker.state is BreakerState.OPEN  # then a was left alone
    state["status"] = 200
    await asyncio.sleep(0.25)
    assert node.breaker.state is BreakerState.HALF_OPEN
    node.load.last_pick, backend.nodes["b"].load.last_pick = 0, 1  # a is next in turn
    events = await drain(backend.chat(chat(stream=True), Ticket("r")))
    assert next(e.node for e in events if isinstance(e, Served)) == "a"
    assert node.breaker.state is BreakerState.CLOSED
    await backend.close()


@on_asyncio
async def test_a_nodes_4xx_does_not_count_against_its_breaker(nodes: FakeNodes) -> None:
    nodes.on("a", answer(lambda: error(400, "bad request")))
    routing = RoutingSettings(health=UpstreamHealth(breaker_failures=1, probe_interval=0))
    backend = nodes.backend("a", routing=routing)
    for _ in range(3):
        with pytest.raises(APIError):
            await drain(backend.chat(chat(), Ticket("r")))
    assert backend.nodes["a"].breaker.state is BreakerState.CLOSED
    await backend.close()


@on_asyncio
async def test_active_probes_mark_a_node_down_and_up(nodes: FakeNodes) -> None:
    state = {"up": False}

    async def node(request: web.Request) -> web.Response:
        assert request.method == "GET" and request.path == "/a/v1/models"
        return web.json_response({"data": []}, status=200 if state["up"] else 503)

    nodes.on("a", node)
    routing = RoutingSettings(health=UpstreamHealth(probe_interval=0.02, unhealthy_after=2))
    backend = nodes.backend("a", routing=routing)
    await backend.start()
    await _until(lambda: not backend.nodes["a"].health.healthy)
    assert backend.status()["nodes"][0]["healthy"] is False
    state["up"] = True
    await _until(lambda: backend.nodes["a"].health.healthy)
    await backend.close()
    assert nodes.hits("a") >= 3


async def _until(condition: object, timeout: float = 2.0) -> None:
    async with asyncio.timeout(timeout):
        while not condition():
            await asyncio.sleep(0.01)
