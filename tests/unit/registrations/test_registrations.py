"""Below the HTTP layer: sealing node keys, and the registrations table applied to a process's routed models."""

from __future__ import annotations

import asyncio
from pathlib import Path

from pydantic import SecretStr

from tokenrelay.backends.upstream.backend import RoutedBackend
from tokenrelay.config import ModelSettings, Settings, UpstreamSettings
from tokenrelay.registrations.sealing import KeySeal
from tokenrelay.server.services import Services
from tokenrelay.store.migrate import upgrade

NODE_KEY = SecretStr("sk-node-key-9f2e")


def test_a_sealed_key_opens_only_under_the_same_admin_key() -> None:
    token = KeySeal(SecretStr("admin-1")).seal(NODE_KEY)
    assert NODE_KEY.get_secret_value() not in token
    assert KeySeal(SecretStr("admin-1")).open(token) == NODE_KEY
    assert KeySeal(SecretStr("admin-2")).open(token) is None
    assert KeySeal(None).open(token) is None and not KeySeal(None).available


def _node(name: str, **extra: object) -> UpstreamSettings:
    return UpstreamSettings(url=f"http://127.0.0.1:9/{name}/v1", name=name, **extra)


def _served(services: Services, model: str, name: str) -> UpstreamSettings:
    backend = services.registry.get(model)
    assert isinstance(backend, RoutedBackend)
    return backend.nodes[name].settings


async def _scenario(tmp: Path) -> list[object]:
    configured = ModelSettings(id="m", upstreams=[_node("base")])
    settings = Settings(data_dir=tmp, admin_key=SecretStr("admin"), models=[configured])
    settings.routing.health.probe_interval = 0
    one, other = Services(settings), Services(settings)  # two processes on one database
    await upgrade(one.accounting.engine)
    seen: list[object] = []
    for services in (one, other):
        services.registry.add(RoutedBackend("m", settings.routing, configured.upstreams))
    await one.nodes.store.put("dyn", _node("x", api_key=NODE_KEY))
    await one.nodes.store.put("m", _node("base", weight=3))
    await other.nodes.refresh()
    dyn = other.registry.get("dyn")
    assert isinstance(dyn, RoutedBackend) and dyn.dynamic
    seen += [_served(other, "dyn", "x").api_key, _served(other, "m", "base").weight]
    await one.nodes.store.put("dyn", _node("x", weight=2))  # changed settings replace the node
    await other.nodes.refresh()
    seen.append(_served(other, "dyn", "x").weight)
    assert await one.nodes.store.delete("x") == 1 and await one.nodes.store.delete("base", "m") == 1
    await other.nodes.refresh()
    seen += [other.registry.find("dyn"), _served(other, "m", "base").weight]  # gone; the config file's node back
    for services in (one, other):
        await services.close()
    return seen


def test_the_table_is_applied_like_registrations(tmp_path: Path) -> None:
    assert asyncio.run(_scenario(tmp_path)) == [NODE_KEY, 3.0, 2.0, None, 1.0]


async def _native_registration(tmp: Path) -> tuple[bool, object]:
    settings = Settings(data_dir=tmp, admin_key=SecretStr("admin"), models=[])
    settings.routing.health.probe_interval = 0
    one, other = Services(settings), Services(settings)
    await upgrade(one.accounting.engine)
    await one.nodes.store.put("dyn", _node("x", native_apis=["messages"]))
    await other.nodes.refresh()
    backend = other.registry.get("dyn")
    assert isinstance(backend, RoutedBackend)
    result = backend.relays("messages") and not backend.relays("responses"), backend.status()["nodes"]
    for services in (one, other):
        await services.close()
    return result


def test_a_registered_nodes_native_apis_are_kept_and_shown(tmp_path: Path) -> None:
    relays, nodes = asyncio.run(_native_registration(tmp_path))
    assert relays
    assert [node["native_apis"] for node in nodes] == [["messages"]]  # type: ignore[attr-defined]
