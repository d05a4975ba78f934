"""`serve --workers 2` in front of loopback nodes: load shared by both workers, one ledger, metrics summed over the
workers, registrations seen by every worker, a graceful SIGTERM, and the refusal to copy an embedded model."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import openai
import pytest
from accounting_support import create_key, ledger_rows, sqlite_url
from gateway_support import (
    SYNC_SECONDS,
    chat,
    gateway_config,
    register,
    start_gateway,
    unregister,
    wait_for,
    workers_of,
)
from loopback_node import LoopbackNode, loopback_node
from observing import scrape
from servers import ROOT, Server, free_port, server_env

LOAD = 100


@dataclass
class Deployment:
    server: Server
    node: LoopbackNode
    url: str
    key: str


@pytest.fixture(scope="module")
def deployment(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    tmp = tmp_path_factory.mktemp("workers")
    url = sqlite_url(tmp)  # one SQLite file for both workers
    key = create_key(url, "load")
    with loopback_node() as node:
        server = start_gateway(tmp, gateway_config(tmp, node.url), url, "--workers", "2")
        try:
            yield Deployment(server, node, url, key)
        finally:
            server.stop()


async def _load(server: Server, key: str, request_ids: list[str]) -> list[int]:
    async with openai.AsyncOpenAI(base_url=f"{server.base_url}/v1", api_key=key, max_retries=0, timeout=60) as client:

        async def one(request_id: str) -> int:
            reply = await client.chat.completions.with_raw_response.create(
                model="m",
                messages=[{"role": "user", "content": "hi"}],
                max_tokens=3,
                extra_headers={"X-Request-ID": request_id},
            )
            return reply.status_code

        return list(await asyncio.gather(*(one(rid) for rid in request_ids)))


def test_concurrent_requests_use_both_workers_and_one_ledger(deployment: Deployment) -> None:
    request_ids = [uuid.uuid4().hex for _ in range(LOAD)]
    assert asyncio.run(_load(deployment.server, deployment.key, request_ids)) == [200] * LOAD
    assert len(workers_of(deployment.server, request_ids)) == 2

    def rows() -> list[dict[str, object]]:
        return [r for r in ledger_rows(deployment.url) if r["key_name"] == "load"]

    wait_for(lambda: len(rows()) >= LOAD, "the ledger rows")
    written = rows()
    assert sorted(r["request_id"] for r in written) == sorted(request_ids)
    assert {r["status"] for r in written} == {200}


def test_metrics_count_every_workers_requests(deployment: Deployment) -> None:
    # After the test above: both workers served some of the 100 requests, so a worker showing only its own
    # would count fewer. Each scrape is a new connection, answered by either worker.
    labels = {"model": "m", "endpoint": "chat.completions", "status": "200", "key": "load"}
    for _ in range(6):
        samples = scrape(deployment.server)
        assert samples[("tokenrelay_requests_total", frozenset(labels.items()))] == LOAD
        latency = (
            "tokenrelay_request_duration_seconds_count",
            frozenset({"model": "m", "endpoint": "chat.completions"}.items()),
        )
        assert samples[latency] == LOAD


def test_a_registration_reaches_every_worker(deployment: Deployment) -> None:
    server, key = deployment.server, deployment.key
    assert register(server, "dyn", deployment.node.url, "extra").status_code == 201
    request_ids = [uuid.uuid4().hex for _ in range(20)]
    assert [chat(server, "dyn", rid, key).status_code for rid in request_ids] == [200] * 20
    assert len(workers_of(server, request_ids)) == 2

    assert unregister(server, "extra").status_code == 204
    gone: list[str] = []

    def refused_by_both() -> bool:  # once the other worker's next sync has run
        gone[:] = [uuid.uuid4().hex for _ in range(20)]
        return [chat(server, "dyn", rid, key).status_code for rid in gone] == [404] * 20

    wait_for(refused_by_both, "the unregistration to reach both workers", timeout=SYNC_SECONDS * 10)
    assert len(workers_of(server, gone)) == 2


def test_an_embedded_model_is_refused_with_several_workers(tmp_path: Path) -> None:
    command = [sys.executable, "-m", "tokenrelay", "serve", "--workers", "2", "--data-dir", str(tmp_path)]
    result = subprocess.run(command, capture_output=True, text=True, env=server_env(), cwd=ROOT, timeout=60)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "tokenrelay: --workers 2 needs upstream-only models, but gemma-3-270m, smollm2-135m-instruct run on the "
        "embedded llama.cpp engine (each worker would load its own copy); use --workers 1"
    ]
    assert not list(tmp_path.iterdir())  # refused before anything was created


def test_a_worker_that_cannot_start_stops_the_supervisor_with_an_error(tmp_path: Path) -> None:
    with loopback_node() as node:  # no API key exists, so serving beyond loopback is refused by each worker
        config = gateway_config(tmp_path, node.url)
        command = [sys.executable, "-m", "tokenrelay", "serve", "--workers", "2", "--config", str(config)]
        command += ["--host", "0.0.0.0", "--port", str(free_port()), "--data-dir", str(tmp_path)]
        result = subprocess.run(command, capture_output=True, text=True, env=server_env(), cwd=ROOT, timeout=120)
    assert result.returncode == 3
    assert "refusing to serve on 0.0.0.0 without authentication" in result.stderr


@dataclass
class Stream:
    request_id: str
    chunks: int = 0
    finished: bool = False


async def _stream(client: openai.AsyncOpenAI, stream: Stream, tokens: int, started: asyncio.Event) -> None:
    try:
        reply = await client.chat.completions.create(
            model="m",
            messages=[{"role": "user", "content": "hi"}],
            max_tokens=tokens,
            stream=True,
            extra_headers={"X-Request-ID": stream.request_id},
        )
        async for chunk in reply:
            if chunk.choices and chunk.choices[0].delta.content:
                stream.chunks += 1
                started.set()
            if chunk.choices and chunk.choices[0].finish_reason:
                stream.finished = True
    except (openai.APIError, OSError):
        pass  # cut at the end of the grace period
    finally:
        started.set()


async def _streams_through_sigterm(server: Server, key: str, short: list[Stream], long: list[Stream]) -> None:
    async with openai.AsyncOpenAI(base_url=f"{server.base_url}/v1", api_key=key, max_retries=0, timeout=60) as client:
        started = {s.request_id: asyncio.Event() for s in short + long}
        tasks = []
        for pair in zip(short, long, strict=True):
            for stream, tokens in zip(pair, (12, 1000), strict=True):
                tasks.append(asyncio.create_task(_stream(client, stream, tokens, started[stream.request_id])))
                # One connection at a time: a burst would be accepted by whichever worker woke first.
                await asyncio.sleep(0.05)
        await asyncio.wait_for(asyncio.gather(*(e.wait() for e in started.values())), 30)
        server.process.send_signal(signal.SIGTERM)
        await asyncio.wait_for(asyncio.gather(*tasks), 60)


def test_sigterm_during_streams_loses_no_row(tmp_path: Path) -> None:
    url = sqlite_url(tmp_path)
    key = create_key(url, "streams")
    short = [Stream(f"short-{i}") for i in range(5)]
    long = [Stream(f"long-{i}") for i in range(5)]
    with loopback_node(pause=0.1) as node:
        config = gateway_config(tmp_path, node.url)
        server = start_gateway(tmp_path, config, url, "--workers", "2", "--shutdown-timeout", "3")
        try:
            asyncio.run(_streams_through_sigterm(server, key, short, long))
            assert server.process.wait(timeout=60) == 0
        finally:
            server.stop()
    log = server.log()
    assert log.count("Application shutdown complete.") == 2, log[-3000:]
    assert "spill" not in log, log[-3000:]
    assert "timeout graceful shutdown exceeded" in log  # the long streams were cut, not waited for
    assert len(workers_of(server, [s.request_id for s in short + long])) == 2
    rows = {r["request_id"]: r for r in ledger_rows(url)}
    assert set(rows) == {s.request_id for s in short + long}
    for s in short:  # 1.3 s of stream: done within the 3 s grace period
        assert s.finished and rows[s.request_id]["status"] == 200 and rows[s.request_id]["completion_tokens"] == 12
    for s in long:  # cut at the deadline, with what they had streamed
        row = rows[s.request_id]
        assert not s.finished and row["cancelled"], row
        assert row["completion_tokens"] >= s.chunks >= 1
