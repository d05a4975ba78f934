"""Two replicas (two server processes on one SQLite file) in front of a loopback node hold a key's 60 requests per
minute together: through the Redis at 127.0.0.1:6379 with `--redis-url`, and through the database without it.
A server whose Redis is not there still serves, counting on its own, and says so once in its log."""

from __future__ import annotations

import asyncio
import math
import socket
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import redis
from accounting_support import create_key, query, sqlite_url
from gateway_support import gateway_config, start_gateway
from loopback_node import loopback_node
from servers import Server

REDIS_URL = "redis://127.0.0.1:6379/0"
RPM = 60
LOAD = 100


@dataclass
class Outcome:
    status: int
    retry_after: str | None


@contextmanager
def replicas(tmp: Path, url: str, count: int, *flags: str) -> Iterator[list[Server]]:
    """`count` servers on one database in front of one loopback node."""
    with loopback_node() as node, ExitStack() as stack:
        config = gateway_config(tmp, node.url)
        servers = []
        for _ in range(count):
            server = start_gateway(tmp, config, url, *flags)
            stack.callback(server.stop)
            servers.append(server)
        yield servers


async def _burst(servers: list[Server], key: str, size: int) -> list[Outcome]:
    """`size` chat requests at once, alternating between the servers."""
    headers = {"Authorization": f"Bearer {key}"}
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}
    limits = httpx.Limits(max_connections=size)
    async with httpx.AsyncClient(headers=headers, timeout=60, limits=limits) as http:

        async def one(i: int) -> Outcome:
            reply = await http.post(f"{servers[i % len(servers)].base_url}/v1/chat/completions", json=body)
            return Outcome(reply.status_code, reply.headers.get("retry-after"))

        return list(await asyncio.gather(*(one(i) for i in range(size))))


def _hold_the_limit_together(servers: list[Server], key: str) -> None:
    started = time.monotonic()
    outcomes = asyncio.run(_burst(servers, key, LOAD))
    elapsed = time.monotonic() - started
    served = [o for o in outcomes if o.status == 200]
    refused = [o for o in outcomes if o.status == 429]
    assert len(served) + len(refused) == LOAD, sorted({o.status for o in outcomes})
    # The burst of 60 fits at once; the bucket drains one request a second meanwhile.
    assert RPM <= len(served) <= RPM + math.ceil(elapsed), (len(served), elapsed)
    assert all(o.retry_after is not None and int(o.retry_after) >= 1 for o in refused)


def _key_id(url: str, name: str) -> str:
    return query(url, "SELECT id FROM api_keys WHERE name = :name", name=name)[0]["id"]


@dataclass
class Deployment:
    url: str
    servers: list[Server]
    redis: redis.Redis

    def buckets(self, key_name: str) -> dict[bytes, bytes]:
        return self.redis.hgetall(f"tokenrelay:rates:{_key_id(self.url, key_name)}")


@pytest.fixture(scope="module")
def with_redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    tmp = tmp_path_factory.mktemp("redis-rates")
    url = sqlite_url(tmp)
    client = redis.Redis.from_url(REDIS_URL)
    try:
        with replicas(tmp, url, 2, "--redis-url", REDIS_URL) as servers:
            yield Deployment(url, servers, client)
    finally:
        for row in query(url, "SELECT id FROM api_keys"):
            client.delete(f"tokenrelay:rates:{row['id']}")
        client.close()


def test_two_replicas_with_redis_hold_60_rpm_together(with_redis: Deployment) -> None:
    key = create_key(with_redis.url, "shared-rpm", "--rpm", str(RPM))
    _hold_the_limit_together(with_redis.servers, key)
    assert RPM - 5 <= float(with_redis.buckets("shared-rpm")[b"rpm"]) <= RPM  # counted in Redis
    rows = query(with_redis.url, "SELECT rpm_level FROM key_counters c JOIN api_keys k ON k.id = c.key_id")
    assert [row["rpm_level"] for row in rows] == [0]  # not in the database
    assert all("counted in Redis at redis://127.0.0.1:6379/0" in s.log() for s in with_redis.servers)


def test_tokens_a_request_did_not_use_go_back_to_redis(with_redis: Deployment) -> None:
    # Each request reserves about 600 tokens (its JSON bounds the prompt) and uses 7: five fit at once, and
    # twenty in a row fit only if each gives back what it did not use.
    key = create_key(with_redis.url, "shared-tpm", "--tpm", "3000")
    outcomes = [asyncio.run(_burst([with_redis.servers[i % 2]], key, 1))[0] for i in range(20)]
    assert [o.status for o in outcomes] == [200] * 20
    assert float(with_redis.buckets("shared-tpm")[b"tpm"]) < 600


def test_two_replicas_without_redis_hold_60_rpm_together_through_the_database(tmp_path: Path) -> None:
    url = sqlite_url(tmp_path)
    key = create_key(url, "db-rpm", "--rpm", str(RPM))
    with replicas(tmp_path, url, 2) as servers:
        _hold_the_limit_together(servers, key)
    assert query(url, "SELECT rpm_level FROM key_counters")[0]["rpm_level"] > RPM - 5


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_a_server_whose_redis_is_down_serves_and_counts_on_its_own(tmp_path: Path) -> None:
    url = sqlite_url(tmp_path)
    key = create_key(url, "local-rpm", "--rpm", "5")
    with replicas(tmp_path, url, 1, "--redis-url", f"redis://127.0.0.1:{_closed_port()}/0") as servers:
        outcomes = asyncio.run(_burst(servers, key, 8))
        assert sorted(o.status for o in outcomes) == [200] * 5 + [429] * 3
        log = servers[0].log()
    assert log.count("is not answering") == 1, log[-3000:]
    assert "counts requests and tokens per minute on its own" in log
