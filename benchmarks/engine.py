"""Embedded engine throughput: tokenrelay vs llama-cpp-python's own server, same model, same prompts.

Runs, in one go: tokenrelay (continuous batching) and `python -m llama_cpp.server` on the default model, each
at concurrency 1, 4 and 16 with fixed prompts, streaming 48-token greedy completions. Prints aggregate decode
tokens/s, time to first token p50/p99 and resident memory side by side, plus how many greedy outputs under
concurrency equal the same request run alone (batch invariance), and constrained decoding speed as a fraction
of unconstrained (`constrained.py`).

    python benchmarks/engine.py [--max-tokens 48] [--rounds 2] [--trials 3] [--seqs-per-pass 7]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "tests"))

from conftest import free_port, server_env, shared_data_dir  # noqa: E402
from constrained import constrained_report  # noqa: E402
from tokenrelay.backends.llamacpp.default_model import ensure_default_model  # noqa: E402

PROMPTS = [
    f"Story {i}: Once upon a time in a land of {topic}, there lived"
    for i, topic in enumerate(
        [
            "rivers",
            "mountains",
            "glass",
            "clocks",
            "bees",
            "salt",
            "wind",
            "lanterns",
            "snow",
            "copper",
            "owls",
            "ferns",
            "ships",
            "bells",
            "moss",
            "stars",
        ]
    )
]


@dataclass
class Result:
    tokens: int
    seconds: float
    ttfts: list[float]
    texts: list[str]

    @property
    def tok_s(self) -> float:
        return self.tokens / self.seconds


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def start(command: list[str], port: int, log: Path) -> subprocess.Popen[bytes]:
    with log.open("wb") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=server_env())
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{command[:4]} exited:\n{log.read_text()[-3000:]}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=2).status_code == 200:
                return process
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    process.kill()
    raise RuntimeError("server did not start")


async def one(
    client: httpx.AsyncClient, model: str, prompt: str, max_tokens: int, stream: bool = True
) -> tuple[int, float, str]:
    """(completion tokens, time to first token, text) of one greedy completion.

    Non-streamed requests report their whole latency as the time to first token (an upper bound)."""
    body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "stream": stream}
    started = time.perf_counter()
    if not stream:
        reply = (await client.post("/v1/completions", json=body)).json()
        return reply["usage"]["completion_tokens"], time.perf_counter() - started, reply["choices"][0]["text"]
    body["stream_options"] = {"include_usage": True}
    ttft, text, tokens, counted = None, [], 0, 0
    async with client.stream("POST", "/v1/completions", json=body) as response:
        async for line in response.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if chunk.get("choices"):
                piece = chunk["choices"][0].get("text") or ""
                if piece and ttft is None:
                    ttft = time.perf_counter() - started
                text.append(piece)
                counted += 1 if piece else 0
            if chunk.get("usage"):
                tokens = chunk["usage"]["completion_tokens"]
    # llama_cpp.server sends no usage chunk; both servers send one chunk per generated token.
    return tokens or counted, ttft if ttft is not None else float("nan"), "".join(text)


async def run_level(
    base: str, model: str, concurrency: int, max_tokens: int, rounds: int, stream: bool = True
) -> Result:
    prompts = [PROMPTS[i % len(PROMPTS)] for i in range(concurrency * rounds)]
    queue: asyncio.Queue[str] = asyncio.Queue()
    for p in prompts:
        queue.put_nowait(p)
    outs: list[tuple[int, float, str]] = []

    async def worker() -> None:
        while not queue.empty():
            # A connection per request: llama_cpp.server drops queued streams that arrive on a reused
            # keep-alive connection; loopback connects cost nothing next to token generation.
            async with httpx.AsyncClient(base_url=base, timeout=600) as client:
                outs.append(await one(client, model, queue.get_nowait(), max_tokens, stream))

    async with httpx.AsyncClient(base_url=base, timeout=600) as client:
        await one(client, model, PROMPTS[0], 2)  # warm-up
    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    seconds = time.perf_counter() - started
    return Result(sum(o[0] for o in outs), seconds, [o[1] for o in outs], [o[2] for o in outs])


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000


async def greedy_texts(base: str, model: str, concurrency: int, max_tokens: int) -> list[str]:
    async with httpx.AsyncClient(base_url=base, timeout=600) as client:
        outs = await asyncio.gather(*(one(client, model, p, max_tokens) for p in PROMPTS[:concurrency]))
    return [o[2] for o in outs]


@dataclass
class Server:
    name: str
    process: subprocess.Popen[bytes]
    base: str
    model: str
    runs: dict[int, list[Result]]


def trial(server: Server, level: int, args: argparse.Namespace) -> Result:
    # llama_cpp.server drops streams that queue behind another one, so beyond one client it is driven
    # with non-streamed requests (its "ttft" is then the whole latency, an upper bound).
    stream = server.name.startswith("tokenrelay") or level == 1
    result = asyncio.run(run_level(server.base, server.model, level, args.max_tokens, args.rounds, stream))
    server.runs.setdefault(level, []).append(result)
    print(
        f"  {server.name:<18} c={level:<3} {result.tok_s:7.1f} tok/s  ttft p50 {pct(result.ttfts, 0.5):7.0f} ms"
        f"  p99 {pct(result.ttfts, 0.99):7.0f} ms  rss {rss_mib(server.process.pid):6.0f} MiB",
        flush=True,
    )
    return result


def median_tok_s(server: Server, level: int) -> float:
    return statistics.median(r.tok_s for r in server.runs[level])


def pooled_ttfts(server: Server, level: int) -> list[float]:
    return [t for r in server.runs[level] for t in r.ttfts]


def identical_outputs(server: Server, max_tokens: int) -> int:
    """How many of 16 greedy completions run together equal the same request run alone."""
    alone = [asyncio.run(one_alone(server.base, server.model, p, max_tokens)) for p in PROMPTS[:16]]
    together = asyncio.run(greedy_texts(server.base, server.model, 16, max_tokens))
    return sum(a == b for a, b in zip(alone, together, strict=True))


async def one_alone(base: str, model: str, prompt: str, max_tokens: int) -> str:
    async with httpx.AsyncClient(base_url=base, timeout=600) as client:
        return (await one(client, model, prompt, max_tokens))[2]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--rounds", type=int, default=2, help="requests per client in one trial")
    parser.add_argument("--trials", type=int, default=3, help="alternating trials per server and level (medians)")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 2)
    parser.add_argument("--seqs-per-pass", type=int, default=None, help="tokenrelay's --seqs-per-pass")
    args = parser.parse_args()
    data = shared_data_dir()
    gguf = ensure_default_model(data)
    logs = Path(tempfile.mkdtemp(prefix="bench-engine-"))
    servers: list[Server] = []
    try:
        servers.append(start_tokenrelay(data, logs, args))
        servers.append(start_llama_cpp_server(gguf, logs, args))
        # Both servers stay up and take turns, trial by trial: load from elsewhere on a shared machine
        # then falls on both alike, and the medians compare like with like.
        for level in (1, 4, 16):
            for _ in range(args.trials):
                for server in servers:
                    trial(server, level, args)
        tokenrelay = servers[0]
        identical = identical_outputs(tokenrelay, args.max_tokens)
        constrained = constrained_report(tokenrelay.base, tokenrelay.model)
        report(servers, identical, constrained)
    finally:
        for server in servers:
            server.process.terminate()
            server.process.wait()


def start_tokenrelay(data: Path, logs: Path, args: argparse.Namespace) -> Server:
    port = free_port()
    command = [sys.executable, "-m", "tokenrelay", "serve", "--port", str(port), "--data-dir", str(data)]
    command += ["--slots", "16", "--ctx-size", "512", "--threads", str(args.threads)]
    if args.seqs_per_pass is not None:
        command += ["--seqs-per-pass", str(args.seqs_per_pass)]
    process = start(command, port, logs / "tokenrelay.log")
    base = f"http://127.0.0.1:{port}"
    health = httpx.get(f"{base}/health").json()["models"]["gemma-3-270m"]
    print(f"tokenrelay: 16 slots, kernel invariance probe={health['kernel_invariance_probe']}", flush=True)
    return Server("tokenrelay", process, base, "gemma-3-270m", {})


def start_llama_cpp_server(gguf: Path, logs: Path, args: argparse.Namespace) -> Server:
    port = free_port()
    command = [sys.executable, "-m", "llama_cpp.server", "--model", str(gguf), "--port", str(port)]
    command += ["--n_ctx", "2048", "--n_threads", str(args.threads), "--n_threads_batch", str(args.threads)]
    process = start(command, port, logs / "llama_cpp_server.log")
    return Server("llama_cpp.server", process, f"http://127.0.0.1:{port}", str(gguf), {})


def report(servers: list[Server], identical: int, constrained: list[str]) -> None:
    print(
        f"\nmedians of {len(servers[0].runs[1])} alternating trials; ttft percentiles over all trials\n{'':<20}"
        + "".join(f"{'c=' + str(c) + ' tok/s':>14}{'ttft p50':>10}{'p99':>8}" for c in (1, 4, 16))
        + f"{'RSS MiB':>9}"
    )
    for server in servers:
        cells = "".join(
            f"{median_tok_s(server, c):>14.1f}{pct(pooled_ttfts(server, c), 0.5):>10.0f}"
            f"{pct(pooled_ttfts(server, c), 0.99):>8.0f}"
            for c in (1, 4, 16)
        )
        print(f"{server.name:<20}{cells}{rss_mib(server.process.pid):>9.0f}")
    tokenrelay, peer = servers
    for level, target in ((16, 2.5), (4, None), (1, 0.95)):
        ratios = [a.tok_s / b.tok_s for a, b in zip(tokenrelay.runs[level], peer.runs[level], strict=True)]
        goal = f" (target >= {target}x)" if target else ""
        of_medians = median_tok_s(tokenrelay, level) / median_tok_s(peer, level)
        trials = ", ".join(f"{r:.2f}" for r in ratios)
        print(f"ratio at c={level:<2}: {of_medians:.2f}x of medians{goal}; per trial {trials}")
    print(f"greedy outputs identical alone vs 16 concurrent: {identical}/16")
    print("\n".join(constrained))


if __name__ == "__main__":
    main()
