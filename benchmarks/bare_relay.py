"""The floor under tokenrelay's relay: the same server stack with none of tokenrelay's own work, beside the mock node.

Run from a checkout: `python benchmarks/bare_relay.py` (needs `wrk`, like `gateway.py`, whose helpers it uses).
It starts the mock node and a bare ASGI relay on uvicorn that reads the body, rewrites `model`, sends it
through tokenrelay's node client (`backends/upstream/http1.py`) and returns the node's answer with `id` and
`model` rewritten, or its stream's bytes as they come: no keys, validation, routing, rendering, log line,
metrics or ledger. What tokenrelay spends beyond this figure is its own work per request.
Not part of the test run: figures depend on the machine and on whatever else it is doing.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
from contextlib import ExitStack
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

import gateway  # a sibling script, found through the path above


class BareRelay:
    """The ASGI app: one node, one pool, nothing else."""

    def __init__(self, node_port: int) -> None:
        self.node_port = node_port
        self.pool: Any = None

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            await _lifespan(receive, send)
            return
        from tokenrelay.api.parsing import read_body
        from tokenrelay.backends.upstream.http1 import Pool
        from tokenrelay.jsonbytes import dumps

        if self.pool is None:
            self.pool = Pool(f"http://127.0.0.1:{self.node_port}/v1", {}, 5.0)
        request = json.loads(await read_body(receive))  # tokenrelay's own body reader
        request["model"] = "mock"
        deadline = asyncio.get_running_loop().time() + 30
        reply = await self.pool.request("POST", "/chat/completions", dumps(request), {}, deadline)
        try:
            if request.get("stream"):
                await send(
                    {"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/event-stream")]}
                )
                while (piece := await reply.next_piece()) is not None:
                    await send({"type": "http.response.body", "body": piece, "more_body": True})
                await send({"type": "http.response.body", "body": b""})
                return
            answer = json.loads(await reply.read())
            answer["id"], answer["model"] = "chatcmpl-bare", "bench"
            data = dumps(answer)
            headers = [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode())]
            await send({"type": "http.response.start", "status": 200, "headers": headers})
            await send({"type": "http.response.body", "body": data})
        finally:
            reply.release()


async def _lifespan(receive: Any, send: Any) -> None:
    while (await receive())["type"] != "lifespan.shutdown":
        await send({"type": "lifespan.startup.complete"})
    await send({"type": "lifespan.shutdown.complete"})


def serve(port: int, node_port: int) -> None:
    import uvicorn

    uvicorn.run(BareRelay(node_port), host="127.0.0.1", port=port, log_level="warning", access_log=False)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--serve", nargs=2, type=int, metavar=("PORT", "NODE_PORT"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve(*args.serve)
        return 0
    work = Path(tempfile.mkdtemp(prefix="bare-relay-"))
    with ExitStack() as stack:
        node = gateway.start_mock(stack, work)
        node_port = int(node.url.split(":")[2].split("/")[0])
        port = gateway.free_port()
        log = work / "bare-relay.log"
        command = [sys.executable, __file__, "--serve", str(port), str(node_port)]
        proc = stack.enter_context(gateway.process(command, log))
        relay = gateway.Target("bare relay", f"http://127.0.0.1:{port}/v1/chat/completions", "bench", pid=proc.pid)
        gateway.wait_until_serving(relay, log)
        print("concurrency 64, medians of", args.rounds, "rounds")
        for stream in (False, True):
            for target in (node, relay):
                results = [gateway.run_wrk(target, stream, 64, args.seconds, work) for _ in range(args.rounds)]
                rps = statistics.median(r.rps for r in results)
                cpu = statistics.median(r.cpu_us or 0.0 for r in results)
                mode = "stream" if stream else "json"
                print(f"  {target.name:10} {mode:6} {rps:8.0f} req/s  cpu {cpu:4.0f} us/req")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
