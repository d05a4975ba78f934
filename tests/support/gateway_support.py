"""Helpers for tests of upstream-only gateways: a config in front of loopback nodes, several workers, their logs."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import httpx
import yaml
from observing import text_request_lines
from servers import Server, start_server, wait_ready

ADMIN_KEY = "admin-key-for-gateway-tests-5d1e"
ADMIN = {"Authorization": f"Bearer {ADMIN_KEY}"}
SYNC_SECONDS = 0.5


def gateway_config(tmp: Path, node_url: str, **extra: Any) -> Path:
    """One upstream-only model `m` on the node; probes off; registrations reloaded every SYNC_SECONDS."""
    config = {
        "admin_key": ADMIN_KEY,
        "routing": {"health": {"probe_interval": 0}, "registry_sync_seconds": SYNC_SECONDS},
        "models": [{"id": "m", "upstreams": [{"url": node_url, "name": "base"}]}],
        **extra,
    }
    path = tmp / f"gateway-{time.monotonic_ns()}.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def start_gateway(tmp: Path, config: Path, url: str, *args: str, env: dict[str, str] | None = None) -> Server:
    """A gateway on its own data dir and database, ready on every worker it starts."""
    flags = ("--config", str(config), "--database-url", url, *args)
    server = start_server(tmp, *flags, env=env, data_dir=tmp, wait=False)
    wait_ready(server)
    workers = int(args[args.index("--workers") + 1]) if "--workers" in args else 1
    wait_for(lambda: server.log().count("Application startup complete.") >= workers, "every worker to start")
    return server


def wait_for(condition: Any, what: str, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def chat(server: Server, model: str, request_id: str, key: str = "none", **body: Any) -> httpx.Response:
    """One request on a fresh connection, so any worker may take it."""
    payload = {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3, **body}
    headers = {"Authorization": f"Bearer {key}", "X-Request-ID": request_id}
    return httpx.post(f"{server.base_url}/v1/chat/completions", json=payload, headers=headers, timeout=30)


def workers_of(server: Server, request_ids: list[str]) -> set[str]:
    """The pids that served these requests, from their log lines."""
    return {line["worker"] for rid in request_ids for line in text_request_lines(server, rid)}


def register(server: Server, model_id: str, node_url: str, name: str, **extra: Any) -> httpx.Response:
    body = {"model_id": model_id, "url": node_url, "name": name, **extra}
    return httpx.post(f"{server.base_url}/admin/nodes", json=body, headers=ADMIN, timeout=30)


def unregister(server: Server, name: str) -> httpx.Response:
    return httpx.delete(f"{server.base_url}/admin/nodes/{name}", headers=ADMIN, timeout=30)
