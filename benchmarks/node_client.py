"""The node transports alone, side by side: the same exchanges with the benchmark's mock node.

Run from a checkout: `python benchmarks/node_client.py`. It starts `benchmarks/mock_node.py`, then times
non-streamed and streamed chat exchanges, one at a time and 64 at once, through each of tokenrelay's node
transports (`routing.node_client`: `http1` and `aiohttp`), bodies read piece by piece as the relay reads them.
Rounds alternate between the transports and medians are printed, so that a noisy machine affects both alike.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import httpx

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "src"))

from tokenrelay.backends.upstream.client import TRANSPORTS  # noqa: E402

BODY = {"model": "mock", "messages": [{"role": "user", "content": "Say something about foxes."}], "max_tokens": 16}
Exchange = Callable[[bool], Awaitable[int]]  # stream? → bytes received


def client(name: str, url: str) -> tuple[Exchange, Callable[[], Awaitable[None]]]:
    transport = TRANSPORTS[name](url, {"Content-Type": "application/json"}, 5.0)

    async def exchange(stream: bool) -> int:
        reply = await transport.request("POST", "/chat/completions", _payload(stream))
        try:
            size = 0
            while (piece := await reply.next_piece()) is not None:
                size += len(piece)
            return size
        finally:
            reply.release()

    return exchange, transport.close


def _payload(stream: bool) -> bytes:
    return json.dumps(BODY | {"stream": stream}).encode()


async def timed(exchange: Exchange, stream: bool, concurrency: int, count: int) -> float:
    """Requests per second over `count` exchanges, `concurrency` at a time."""
    per_worker = count // concurrency

    async def worker() -> None:
        for _ in range(per_worker):
            assert await exchange(stream) > 0

    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return per_worker * concurrency / (time.perf_counter() - started)


async def compare(url: str, rounds: int, count: int) -> None:
    clients = {name: client(name, url) for name in TRANSPORTS}
    print(f"{'exchange':<10} {'conc':>4} " + " ".join(f"{name:>18}" for name in clients) + f" {'ratio':>7}")
    for stream in (False, True):
        for concurrency in (1, 64):
            figures: dict[str, list[float]] = {name: [] for name in clients}
            for _ in range(rounds):
                for name, (exchange, _) in clients.items():
                    await timed(exchange, stream, concurrency, count // 10)  # warm the pool
                    figures[name].append(await timed(exchange, stream, concurrency, count))
            medians = [statistics.median(values) for values in figures.values()]
            row = " ".join(f"{m:>14,.0f} r/s" for m in medians)
            print(f"{'stream' if stream else 'json':<10} {concurrency:>4} {row} {medians[0] / medians[1]:>6.2f}x")
    for _, close in clients.values():
        await close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--port", type=int, default=9311)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--count", type=int, default=2560, help="exchanges per timed round")
    args = parser.parse_args()
    node = subprocess.Popen([sys.executable, str(HERE / "mock_node.py"), "--port", str(args.port)])
    url = f"http://127.0.0.1:{args.port}/v1"
    try:
        for _ in range(100):
            try:
                httpx.get(url + "/models", timeout=1)
                break
            except httpx.HTTPError:
                time.sleep(0.1)
        try:
            import uvloop

            uvloop.run(compare(url, args.rounds, args.count))  # what uvicorn serves tokenrelay on
        except ImportError:
            asyncio.run(compare(url, args.rounds, args.count))
    finally:
        node.terminate()
        node.wait()


if __name__ == "__main__":
    main()
