"""Embedded engine throughput: tokenrelay vs llama-cpp-python's own server, same model, same prompts.

Runs, in one go: tokenrelay (continuous batching) and `python -m llama_cpp.server` on the default model, each
at concurrency 1, 4 and 16 with fixed prompts, streaming 48-token greedy completions. Prints aggregate decode
tokens/s, time to first token p50/p99 and resident memory side by side, plus how many greedy outputs under
concurrency equal the same request run alone (batch invariance), and constrained decoding speed as a fraction
of unconstrained (`constrained.py`).

    python benchmarks/engine.py [--max-tokens 48] [--rounds 2]
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


def bench(name: str, process: subprocess.Popen[bytes], base: str, model: str, args: argparse.Namespace) -> dict:
    row: dict = {"server": name}
    for level in (1, 4, 16):
        # llama_cpp.server drops streams that queue behind another one, so beyond one client it is driven
        # with non-streamed requests (its "ttft" is then the whole latency, an upper bound).
        stream = name.startswith("tokenrelay") or level == 1
        result = asyncio.run(run_level(base, model, level, args.max_tokens, args.rounds, stream))
        row[level] = result
        print(
            f"  {name:<22} c={level:<3} {result.tok_s:7.1f} tok/s  ttft p50 {pct(result.ttfts, 0.5):7.0f} ms"
            f"  p99 {pct(result.ttfts, 0.99):7.0f} ms  rss {rss_mib(process.pid):6.0f} MiB",
            flush=True,
        )
    row["rss"] = rss_mib(process.pid)
    if name.startswith("tokenrelay"):
        alone = [asyncio.run(greedy_texts(base, model, 1, args.max_tokens))[0]]
        alone += [asyncio.run(one_alone(base, model, p, args.max_tokens)) for p in PROMPTS[1:16]]
        together = asyncio.run(greedy_texts(base, model, 16, args.max_tokens))
        row["identical"] = sum(a == b for a, b in zip(alone, together, strict=True))
    return row


async def one_alone(base: str, model: str, prompt: str, max_tokens: int) -> str:
    async with httpx.AsyncClient(base_url=base, timeout=600) as client:
        return (await one(client, model, prompt, max_tokens))[2]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--rounds", type=int, default=2, help="requests per client at each concurrency level")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 2)
    args = parser.parse_args()
    data = shared_data_dir()
    gguf = ensure_default_model(data)
    logs = Path(tempfile.mkdtemp(prefix="bench-engine-"))
    rows = []

    port = free_port()
    tr = start(
        [
            sys.executable,
            "-m",
            "tokenrelay",
            "serve",
            "--port",
            str(port),
            "--data-dir",
            str(data),
            "--slots",
            "16",
            "--ctx-size",
            "512",
            "--threads",
            str(args.threads),
        ],
        port,
        logs / "tokenrelay.log",
    )
    try:
        health = httpx.get(f"http://127.0.0.1:{port}/health").json()["models"]["gemma-3-270m"]
        print(f"tokenrelay: 16 slots, kernel invariance probe={health['kernel_invariance_probe']}", flush=True)
        rows.append(bench("tokenrelay", tr, f"http://127.0.0.1:{port}", "gemma-3-270m", args))
        constrained = constrained_report(f"http://127.0.0.1:{port}", "gemma-3-270m")
    finally:
        tr.terminate()
        tr.wait()

    port = free_port()
    lc = start(
        [
            sys.executable,
            "-m",
            "llama_cpp.server",
            "--model",
            str(gguf),
            "--port",
            str(port),
            "--n_ctx",
            "2048",
            "--n_threads",
            str(args.threads),
            "--n_threads_batch",
            str(args.threads),
        ],
        port,
        logs / "llama_cpp_server.log",
    )
    try:
        rows.append(bench("llama_cpp.server", lc, f"http://127.0.0.1:{port}", str(gguf), args))
    finally:
        lc.terminate()
        lc.wait()

    print(
        f"\n{'':<20}"
        + "".join(f"{'c=' + str(c) + ' tok/s':>14}{'ttft p50':>10}{'p99':>8}" for c in (1, 4, 16))
        + f"{'RSS MiB':>9}"
    )
    for row in rows:
        cells = "".join(
            f"{row[c].tok_s:>14.1f}{pct(row[c].ttfts, 0.5):>10.0f}{pct(row[c].ttfts, 0.99):>8.0f}" for c in (1, 4, 16)
        )
        print(f"{row['server']:<20}{cells}{row['rss']:>9.0f}")
    tr_row, lc_row = rows
    print(f"\nratio at c=16: {tr_row[16].tok_s / lc_row[16].tok_s:.2f}x (target >= 2.5x)")
    print(f"ratio at c=1:  {tr_row[1].tok_s / lc_row[1].tok_s:.2f}x (target >= 0.95x)")
    print(f"greedy outputs identical alone vs 16 concurrent: {tr_row['identical']}/16")
    print(f"median ttft (ms) tokenrelay c=16: {statistics.median(tr_row[16].ttfts) * 1000:.0f}")
    print("\n".join(constrained))


if __name__ == "__main__":
    main()
