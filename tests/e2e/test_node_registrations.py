"""Nodes registered through `/admin/nodes` live in the database: two replicas on one PostgreSQL serve each other's
registrations, a registration survives a restart, and the node's api_key is stored encrypted."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest
from accounting_support import postgres_database, query
from gateway_support import ADMIN, SYNC_SECONDS, chat, gateway_config, register, start_gateway, unregister
from loopback_node import LoopbackNode, loopback_node
from servers import Server

NODE_KEY = "sk-node-key-that-must-stay-sealed-41c7"


@dataclass
class Replicas:
    a: Server
    b: Server
    url: str
    config: Path
    tmp: Path
    open_node: LoopbackNode
    keyed_node: LoopbackNode
    started: list[Server] = field(default_factory=list)

    def start(self, env: dict[str, str] | None = None) -> Server:
        server = start_gateway(self.tmp, self.config, self.url, env=env)
        self.started.append(server)
        return server


@pytest.fixture(scope="module")
def replicas(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Replicas]:
    tmp = tmp_path_factory.mktemp("registrations")
    with postgres_database() as url, loopback_node() as open_node, loopback_node(api_key=NODE_KEY) as keyed_node:
        config = gateway_config(tmp, open_node.url)
        a = start_gateway(tmp, config, url)
        b = start_gateway(tmp, config, url)
        deployment = Replicas(a, b, url, config, tmp, open_node, keyed_node, [a, b])
        try:
            yield deployment
        finally:
            for server in deployment.started:
                server.stop()


def statuses(server: Server, model: str, count: int = 10) -> list[int]:
    return [chat(server, model, uuid.uuid4().hex).status_code for _ in range(count)]


def nodes_of(server: Server, model: str) -> dict[str, dict[str, object]]:
    listing = httpx.get(f"{server.base_url}/admin/nodes", headers=ADMIN, timeout=10).json()["data"]
    return {row["name"]: row for row in listing if row["model_id"] == model}


def test_a_node_registered_on_one_replica_serves_the_other(replicas: Replicas) -> None:
    response = register(replicas.a, "dyn", replicas.keyed_node.url, "keyed", api_key=NODE_KEY)
    assert response.status_code == 201 and NODE_KEY not in response.text
    assert statuses(replicas.b, "dyn") == [200] * 10  # b never heard of `dyn` before these requests
    assert replicas.keyed_node.answered == 10 and replicas.keyed_node.refused == 0
    assert nodes_of(replicas.b, "dyn")["keyed"]["requests"] == 10


def test_the_node_key_is_stored_encrypted(replicas: Replicas) -> None:
    (row,) = query(replicas.url, "SELECT * FROM registered_nodes WHERE name = 'keyed'")
    assert row["model_id"] == "dyn" and row["settings"]["url"] == replicas.keyed_node.url
    assert "api_key" not in row["settings"]
    assert NODE_KEY not in str(row) and row["api_key_sealed"]
    assert row["created_at"] <= row["updated_at"]


def test_a_registration_survives_a_restart(replicas: Replicas) -> None:
    replicas.b.stop()
    restarted = replicas.start()
    before = replicas.keyed_node.answered
    assert "dyn" in [m["id"] for m in httpx.get(f"{restarted.base_url}/v1/models").json()["data"]]
    assert statuses(restarted, "dyn") == [200] * 10
    assert replicas.keyed_node.answered == before + 10 and replicas.keyed_node.refused == 0  # the key was opened
    replicas.b = restarted


def test_a_server_with_another_admin_key_skips_the_node_it_cannot_decrypt(replicas: Replicas) -> None:
    other = replicas.start(env={"TOKENRELAY_ADMIN_KEY": "another-admin-key"})
    assert statuses(other, "dyn", 2) == [404] * 2  # skipped, rather than sent to the node without its key
    assert statuses(other, "m", 2) == [200] * 2
    other.stop()
    warning = "WARNING tokenrelay.registrations.sync: registered node keyed of model dyn skipped: "
    assert other.log().count(warning + "its api_key cannot be decrypted") == 1  # once, not at every sync
    assert NODE_KEY not in other.log() and replicas.keyed_node.refused == 0


def test_removal_on_one_replica_reaches_the_other_within_the_sync_interval(replicas: Replicas) -> None:
    assert statuses(replicas.b, "dyn", 2) == [200] * 2  # b serves it now
    assert unregister(replicas.a, "keyed").status_code == 204
    assert statuses(replicas.a, "dyn", 2) == [404] * 2  # at once on the replica that removed it
    time.sleep(SYNC_SECONDS + 0.3)
    assert statuses(replicas.b, "dyn", 2) == [404] * 2
    assert "dyn" not in [m["id"] for m in httpx.get(f"{replicas.b.base_url}/v1/models").json()["data"]]
    assert unregister(replicas.b, "keyed").status_code == 404
    assert query(replicas.url, "SELECT * FROM registered_nodes") == []


def test_a_registration_may_override_a_config_node_and_gives_it_back(replicas: Replicas) -> None:
    weighted = register(replicas.a, "m", replicas.open_node.url, "base", weight=5)
    assert weighted.status_code == 200  # `base` of the config file is replaced, not added
    time.sleep(SYNC_SECONDS + 0.3)
    assert nodes_of(replicas.b, "m")["base"]["weight"] == 5
    assert unregister(replicas.a, "base").status_code == 204
    time.sleep(SYNC_SECONDS + 0.3)
    for server in (replicas.a, replicas.b):
        assert nodes_of(server, "m")["base"]["weight"] == 1.0  # the config file's node again
        assert statuses(server, "m", 2) == [200] * 2
    assert unregister(replicas.a, "base").status_code == 404  # config nodes are not registrations
