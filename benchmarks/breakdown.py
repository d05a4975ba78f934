"""Where a relayed request's CPU goes: tokenrelay's app driven in-process, with parts of it switched off.

Run from a checkout: `python benchmarks/breakdown.py` (no wrk needed). It starts the mock node
(`benchmarks/mock_node.py`) as its own process, builds tokenrelay's ASGI app in this one with a real key and
the SQLite ledger, and calls the app directly (no uvicorn, no client sockets) from `--concurrency` tasks, for
non-streamed and streamed chat completions, in three set-ups, side by side:
- `full`: the app as served, relaying to the mock node;
- `canned node`: the model's nodes reached through a transport that answers in this process with the mock's own
  bytes (`CannedNode`), which the relay reads and parses as a node's (so no connection, no system calls, no
  request waiting on the loop);
- `canned, no observers`: as above, and the finished call is not logged, counted in metrics or written to the
  ledger.
The figures are this process's CPU time per request (`time.process_time`, user and system), so the mock node's
own work is not in them. The differences between the columns are the cost of the node exchange and of the
three observers. `--setup` (repeated) and `--modes` pick some of the cells; `--src` measures another source tree (a
`git worktree` of an older commit, say; `benchmarks/instructions.py` counts instructions that way). Not part
of the test run: figures depend on the machine and on whatever else it is doing.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import inspect
import json
import os
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import gateway  # a sibling script, found through the path above
import mock_node

CHECKOUT_SRC = Path(__file__).resolve().parents[1] / "src"

Scope = dict[str, Any]
SETUPS = ("full", "canned node", "canned, no observers")


def request_body(stream: bool) -> bytes:
    return json.dumps({"model": "bench", "messages": gateway.MESSAGES, "max_tokens": 16, "stream": stream}).encode()


def scope_for(body: bytes, key: str) -> Scope:
    headers = [
        (b"host", b"127.0.0.1"),
        (b"content-type", b"application/json"),
        (b"authorization", f"Bearer {key}".encode()),
        (b"content-length", str(len(body)).encode()),
    ]
    return {
        "type": "http",
        "asgi": {"version": "3.0", "spec_version": "2.3"},
        "http_version": "1.1",
        "server": ("127.0.0.1", 8000),
        "client": ("127.0.0.1", 50000),
        "scheme": "http",
        "method": "POST",
        "root_path": "",
        "path": "/v1/chat/completions",
        "raw_path": b"/v1/chat/completions",
        "query_string": b"",
        "headers": headers,
    }


async def call(app: Callable[..., Any], body: bytes, key: str) -> int:
    """One request through the app, as uvicorn would make it; its status."""
    finished = asyncio.Event()
    pending = [{"type": "http.request", "body": body, "more_body": False}]
    status = 0

    async def receive() -> dict[str, Any]:
        if pending:
            return pending.pop()
        await finished.wait()  # the server answers a pending receive once the response is complete
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        nonlocal status
        status = message.get("status", status)
        if message["type"] == "http.response.body" and not message.get("more_body"):
            finished.set()

    await app(scope_for(body, key), receive, send)
    return status


async def measure(app: Callable[..., Any], body: bytes, key: str, requests: int, concurrency: int) -> float:
    """CPU microseconds of this process per request, over `requests` made by `concurrency` tasks."""
    for _ in range(1000):  # warm-up: connections, caches, the key lookup
        assert await call(app, body, key) == 200
    left = requests

    async def client() -> None:
        nonlocal left
        while left > 0:
            left -= 1
            assert await call(app, body, key) == 200

    started = time.process_time()
    await asyncio.gather(*(client() for _ in range(concurrency)))
    return (time.process_time() - started) / requests * 1e6


class CannedReply:
    """The mock node's answer as a transport hands it to the relay: status and type at once, the body in one piece."""

    def __init__(self, content_type: bytes, body: bytes) -> None:
        self.status = 200
        self.content_type = content_type.decode()
        self.body = body

    async def read(self, deadline: float | None = None) -> bytes:
        return self.body

    async def next_piece(self, deadline: float | None = None) -> bytes | None:
        body, self.body = self.body, b""
        return body or None

    def release(self) -> None:
        pass


class CannedNode:
    """A node transport (`backends/upstream/transport.py`) answering every request in this process with the mock
    node's bytes."""

    def __init__(self, url: str, headers: dict[str, str], connect_timeout: float) -> None:
        pass

    async def request(
        self,
        method: str,
        path: str,
        body: bytes = b"",
        headers: dict[str, str] | None = None,
        deadline: float | None = None,
    ) -> CannedReply:
        return CannedReply(*mock_node.answer(body))

    async def close(self) -> None:
        pass


def canned_backend(real: Any) -> Any:
    """A routed backend of the same model and nodes as `real`, whose nodes are reached through `CannedNode`."""
    from tokenrelay.backends.upstream import members
    from tokenrelay.backends.upstream.backend import RoutedBackend

    nodes = [node.settings for node in real.nodes.values()]
    if "transport" in inspect.signature(RoutedBackend).parameters:
        return RoutedBackend(real.card.id, real.routing, nodes, transport=CannedNode)
    # An older tree (`--src`, as `instructions.py` runs it) takes no transport there: its nodes make their clients
    # by the name `members.NodeClient`, which is given the same transport while they are made, so that both trees
    # count the same work.
    made_by = members.NodeClient
    members.NodeClient = functools.partial(made_by, transport=CannedNode)  # type: ignore[misc]
    try:
        return RoutedBackend(real.card.id, real.routing, nodes)
    finally:
        members.NodeClient = made_by  # type: ignore[misc]


@asynccontextmanager
async def canned_node(services: Any) -> AsyncIterator[None]:
    """The benchmark's model served, for a while, by `canned_backend` in place of its own backend."""
    real = services.registry.get("bench")
    canned = canned_backend(real)
    services.registry.put(canned)
    try:
        yield
    finally:
        services.registry.put(real)
        await canned.close()


@contextmanager
def no_observers() -> Iterator[None]:
    from tokenrelay.server.services import Services

    original = Services.end_call

    def unobserved(self: Services, call: Any) -> None:
        call.reported = True

    Services.end_call = unobserved  # type: ignore[method-assign]
    try:
        yield
    finally:
        Services.end_call = original  # type: ignore[method-assign]


@asynccontextmanager
async def setup(name: str, services: Any) -> AsyncIterator[None]:
    if name == "full":
        yield
        return
    async with canned_node(services):
        if name == "canned node":
            yield
            return
        with no_observers():
            yield


Cell = tuple[str, bool]  # a set-up, and whether the requests stream


async def run(port: int, data: Path, key: str, cells: list[Cell], args: argparse.Namespace) -> dict[Cell, float]:
    from tokenrelay.config import Settings
    from tokenrelay.server.app import create_app

    upstream = {"url": f"http://127.0.0.1:{port}/v1", "name": "mock", "model": "mock"}
    settings = Settings(data_dir=str(data), models=[{"id": "bench", "upstreams": [upstream]}])
    app = create_app(settings)
    fastapi_app = getattr(app, "app", app)  # older trees served a wrapper in front of the FastAPI app
    results = {}
    async with fastapi_app.router.lifespan_context(fastapi_app):
        for name, stream in cells:
            async with setup(name, fastapi_app.state.services):
                results[(name, stream)] = await measure(app, request_body(stream), key, args.requests, args.concurrency)
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=20000, help="requests per cell")
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--setup", action="append", choices=SETUPS, help="a set-up (repeatable; default: all)")
    parser.add_argument("--modes", default="json,stream", help="json, stream or both, comma-separated")
    parser.add_argument("--src", type=Path, default=CHECKOUT_SRC, help="the tokenrelay source tree to measure")
    args = parser.parse_args()
    setups = args.setup or list(SETUPS)
    modes = [mode == "stream" for mode in args.modes.split(",")]
    cells = [(name, stream) for name in setups for stream in modes]
    src = str(args.src.resolve())
    sys.path.insert(0, src)  # before any tokenrelay module is imported (they are, inside the functions above)
    import uvloop

    from tokenrelay.observability.logs import configure_logging

    with tempfile.TemporaryDirectory(prefix="tokenrelay-breakdown-") as work:
        data = Path(work)
        env = {"PYTHONPATH": src}
        key = gateway.create_key(["--data-dir", str(data)], env)
        port = gateway.free_port()
        node = [sys.executable, str(Path(__file__).resolve().parent / "mock_node.py"), "--port", str(port)]
        with gateway.process(node, data / "mock-node.log") as proc:
            gateway.wait_until_serving(
                gateway.Target("direct", f"http://127.0.0.1:{port}/v1/chat/completions", "m"), data / "mock-node.log"
            )
            # Request log lines go to a file, as a server's go to its log, not to this terminal.
            log = (data / "tokenrelay.log").open("w")
            saved = os.dup(2)
            os.dup2(log.fileno(), 2)
            try:
                configure_logging("info")
                results = uvloop.run(run(port, data, key, cells, args))
            finally:
                os.dup2(saved, 2)
            assert proc.poll() is None
    print(f"CPU us per request in this process; {args.requests} requests per cell, {args.concurrency} concurrent")
    print(f"{'':<8}" + "".join(f"{name:>24}" for name in setups))
    for stream in modes:
        print(f"{'stream' if stream else 'json':<8}" + "".join(f"{results[(n, stream)]:>24.0f}" for n in setups))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
