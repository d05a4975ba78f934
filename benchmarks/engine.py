"""Embedded engine throughput: tokenrelay vs llama.cpp's own `llama-server`, same GGUF, same requests.

Runs, in one go, three servers on the default Gemma model, alternating trial by trial:
- `tokenrelay`: `tokenrelay serve` with its default engine settings;
- `tokenrelay-by-shape`: the same with `batch_invariant: false` and `kv_type: f16`, so that llama.cpp picks its
  kernels by batch shape: what batch invariance costs;
- `llama-server`: built from the sdist of the installed llama-cpp-python (cmake, server target only, cached under
  the work dir), run as `llama-server -np 16 -c 16384 -t THREADS`.
Each level (1 and 16 concurrent clients) streams 48-token sampled completions (temperature 0.8, seeded, end of
text banned so every request makes the same number of tokens). Prints aggregate tokens/s, time to first token
p50/p99 and RSS per server and level, the ratios, and how many of 16 greedy and 16 seeded completions run
together equal the same requests run alone; then constrained decoding speed (`constrained.py`).

    python benchmarks/engine.py [--max-tokens 48] [--rounds 2] [--trials 3] [--llama-server PATH]
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
from dataclasses import dataclass, field
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "tests" / "support"))

from servers import free_port, server_env, shared_data_dir  # noqa: E402

from constrained import constrained_report  # noqa: E402
from peer_build import llama_server_binary  # noqa: E402
from tokenrelay.backends.llamacpp.cpu import cpu_flags  # noqa: E402
from tokenrelay.backends.llamacpp.default_model import ensure_default_model  # noqa: E402

MODEL = "gemma-3-270m"
NO_EOS = {"1": -100, "106": -100}  # Gemma's end-of-text and end-of-turn tokens
TOPICS = "rivers mountains glass clocks bees salt wind lanterns snow copper owls ferns ships bells moss stars"
PROMPTS = [f"Story {i}: Once upon a time in a land of {topic}, there lived" for i, topic in enumerate(TOPICS.split())]
LEVELS = (1, 16)


@dataclass
class Result:
    tokens: int
    seconds: float
    ttfts: list[float]

    @property
    def tok_s(self) -> float:
        return self.tokens / self.seconds


@dataclass
class Server:
    name: str
    process: subprocess.Popen[bytes]
    base: str
    runs: dict[int, list[Result]] = field(default_factory=dict)


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def start(name: str, command: list[str], logs: Path, env: dict[str, str] | None = None) -> Server:
    port = int(command[command.index("--port") + 1])
    log = logs / f"{name}.log"
    with log.open("wb") as out:
        # A session of its own: a terminal's signals (Ctrl+C included) reach the benchmark, which stops its servers.
        process = subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=server_env(env),
            start_new_session=True,
        )
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{name} exited:\n{log.read_text()[-3000:]}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                return Server(name, process, f"http://127.0.0.1:{port}")
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    process.kill()
    raise RuntimeError(f"{name} did not start")


async def one(client: httpx.AsyncClient, body: dict[str, object]) -> tuple[int, float, str]:
    """(completion tokens, time to first token, text) of one streamed completion.

    llama-server closes idle keep-alive connections on its own schedule, so a request sent on a connection it
    has just closed fails before any answer: such a request is sent once more, on a new connection."""
    try:
        return await _one(client, body)
    except httpx.RemoteProtocolError:
        return await _one(client, body)


async def _one(client: httpx.AsyncClient, body: dict[str, object]) -> tuple[int, float, str]:
    started = time.perf_counter()
    ttft, text = None, []
    async with client.stream("POST", "/v1/completions", json=body | {"stream": True}) as response:
        async for line in response.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            choices = json.loads(line[6:]).get("choices") or [{}]
            piece = choices[0].get("text") or ""
            if piece and ttft is None:
                ttft = time.perf_counter() - started
            text.append(piece)
    # Both servers send one chunk per generated token (and no end of text is allowed): tokens = chunks with text.
    return sum(1 for piece in text if piece), ttft if ttft is not None else float("nan"), "".join(text)


def body(prompt: str, max_tokens: int, seed: int | None, temperature: float) -> dict[str, object]:
    out: dict[str, object] = {"model": MODEL, "prompt": prompt, "max_tokens": max_tokens, "logit_bias": NO_EOS}
    out["temperature"] = temperature
    if seed is not None:
        out["seed"] = seed
    return out


async def run_level(base: str, concurrency: int, max_tokens: int, rounds: int) -> Result:
    work = [body(PROMPTS[i % len(PROMPTS)], max_tokens, i, 0.8) for i in range(concurrency * rounds)]
    outs: list[tuple[int, float, str]] = []

    async def worker(client: httpx.AsyncClient) -> None:
        while work:
            outs.append(await one(client, work.pop()))

    limits = httpx.Limits(max_connections=concurrency + 1)
    async with httpx.AsyncClient(base_url=base, timeout=600, limits=limits) as client:
        await one(client, body(PROMPTS[0], 2, 0, 0.8))  # warm-up
        started = time.perf_counter()
        await asyncio.gather(*(worker(client) for _ in range(concurrency)))
        seconds = time.perf_counter() - started
    return Result(sum(o[0] for o in outs), seconds, [o[1] for o in outs])


def trial(server: Server, level: int, args: argparse.Namespace) -> None:
    result = asyncio.run(run_level(server.base, level, args.max_tokens, args.rounds))
    server.runs.setdefault(level, []).append(result)
    print(
        f"  {server.name:<22} c={level:<3} {result.tok_s:7.1f} tok/s  ttft p50 {pct(result.ttfts, 0.5):6.0f} ms"
        f"  p99 {pct(result.ttfts, 0.99):6.0f} ms  rss {rss_mib(server.process.pid):5.0f} MiB",
        flush=True,
    )


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000


async def texts(base: str, bodies: list[dict[str, object]], together: bool) -> list[str]:
    async with httpx.AsyncClient(base_url=base, timeout=600, limits=httpx.Limits(max_connections=17)) as client:
        if together:
            return [o[2] for o in await asyncio.gather(*(one(client, b) for b in bodies))]
        return [(await one(client, b))[2] for b in bodies]


def identical(server: Server, max_tokens: int, seeded: bool) -> int:
    """How many of 16 completions (greedy, or sampled with a seed) run together equal the same request alone."""
    bodies = [body(p, max_tokens, 1000 + i if seeded else None, 0.8 if seeded else 0.0) for i, p in enumerate(PROMPTS)]
    alone = asyncio.run(texts(server.base, bodies, together=False))
    together = asyncio.run(texts(server.base, bodies, together=True))
    return sum(a == b for a, b in zip(alone, together, strict=True))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--rounds", type=int, default=2, help="requests per client in one trial")
    parser.add_argument("--trials", type=int, default=3, help="alternating trials per server and level (medians)")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 2)
    parser.add_argument("--llama-server", type=Path, default=None, help="a llama-server binary (default: build one)")
    parser.add_argument("--work-dir", type=Path, default=ROOT / ".bench-work", help="where the peer build is kept")
    args = parser.parse_args()
    data = shared_data_dir()
    gguf = ensure_default_model(data)
    binary = args.llama_server or llama_server_binary(args.work_dir)
    logs = Path(tempfile.mkdtemp(prefix="bench-engine-"))
    servers: list[Server] = []
    try:
        servers.append(start_tokenrelay("tokenrelay", data, gguf, logs, args, {}))
        servers.append(start_tokenrelay("tokenrelay-by-shape", data, gguf, logs, args, KERNELS_BY_SHAPE))
        servers.append(start_llama_server(binary, gguf, logs, args))
        # All servers stay up and take turns, trial by trial: load from elsewhere on a shared machine then
        # falls on each alike, and the medians compare like with like.
        for level in LEVELS:
            for _ in range(args.trials):
                for server in servers:
                    trial(server, level, args)
        invariance = {
            s.name: (identical(s, args.max_tokens, False), identical(s, args.max_tokens, True)) for s in servers
        }
        for server in servers[1:]:  # constrained decoding is measured on tokenrelay alone
            server.process.terminate()
        constrained = constrained_report(servers[0].base, MODEL)
        report(servers, invariance, constrained)
    finally:
        for server in servers:
            server.process.terminate()
            server.process.wait()


# The same build with llama.cpp picking its kernels by batch shape, as it does on its own.
KERNELS_BY_SHAPE = {"TOKENRELAY_ENGINE__BATCH_INVARIANT": "false", "TOKENRELAY_ENGINE__KV_TYPE": "f16"}


def start_tokenrelay(
    name: str, data: Path, gguf: Path, logs: Path, args: argparse.Namespace, env: dict[str, str]
) -> Server:
    port = free_port()
    command = [sys.executable, "-m", "tokenrelay", "serve", "--port", str(port), "--data-dir", str(data)]
    command += ["--model", str(gguf), "--model-id", MODEL, "--threads", str(args.threads)]
    server = start(name, command, logs, env)
    health = httpx.get(f"{server.base}/health").json()["models"][MODEL]
    print(f"{name}: {health['slots']} slots, kernel invariance probe={health['kernel_invariance_probe']}", flush=True)
    return server


def start_llama_server(binary: Path, gguf: Path, logs: Path, args: argparse.Namespace) -> Server:
    port = free_port()
    command = [str(binary), "-m", str(gguf), "--host", "127.0.0.1", "--port", str(port), "--alias", MODEL]
    command += ["-np", "16", "-c", "16384", "-t", str(args.threads)]
    if "amx_int8" in cpu_flags():
        command.append("--no-repack")  # its native build dies on CPUs that advertise AMX but fault on it
    return start("llama-server", command, logs)


def median_tok_s(server: Server, level: int) -> float:
    return statistics.median(r.tok_s for r in server.runs[level])


def pooled_ttfts(server: Server, level: int) -> list[float]:
    return [t for r in server.runs[level] for t in r.ttfts]


def report(servers: list[Server], invariance: dict[str, tuple[int, int]], constrained: list[str]) -> None:
    header = "".join(f"{'c=' + str(c) + ' tok/s':>14}{'ttft p50':>10}{'p99':>8}" for c in LEVELS)
    print(f"\nmedians of {len(servers[0].runs[1])} alternating trials; ttft percentiles over all trials")
    print(f"{'':<24}{header}{'identical greedy/seeded':>26}")
    for server in servers:
        cells = "".join(
            f"{median_tok_s(server, c):>14.1f}{pct(pooled_ttfts(server, c), 0.5):>10.0f}"
            f"{pct(pooled_ttfts(server, c), 0.99):>8.0f}"
            for c in LEVELS
        )
        greedy, seeded = invariance[server.name]
        print(f"{server.name:<24}{cells}{f'{greedy}/16 / {seeded}/16':>26}")
    tokenrelay, by_shape, peer = servers
    for level, target in ((16, 1.0), (1, 0.95)):
        print(f"tokenrelay / llama-server at c={level:<2}: {ratio(tokenrelay, peer, level)} (target >= {target}x)")
    for level in LEVELS:
        print(f"tokenrelay / tokenrelay-by-shape at c={level:<2}: {ratio(tokenrelay, by_shape, level)}")
    print("\n".join(constrained))


def ratio(a: Server, b: Server, level: int) -> str:
    trials = ", ".join(f"{x.tok_s / y.tok_s:.2f}" for x, y in zip(a.runs[level], b.runs[level], strict=True))
    return f"{median_tok_s(a, level) / median_tok_s(b, level):.2f}x of medians (per trial {trials})"


if __name__ == "__main__":
    main()
