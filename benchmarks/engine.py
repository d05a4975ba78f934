"""Embedded engine throughput: tokenrelay vs llama.cpp's own `llama-server`, same GGUF, same requests.

Runs, in one go, these servers on the default Gemma model, alternating trial by trial:
- `tokenrelay`: `tokenrelay serve` with its default engine settings;
- each `--variant NAME:VAR=VALUE,...`: the same with those environment variables (e.g. a kernel switch);
- `tokenrelay-by-shape`: the same with `batch_invariant: false` and `kv_type: f16`, so that llama.cpp picks its
  kernels by batch shape: what batch invariance costs (left out with `--skip-by-shape`);
- `llama-server`: built from the sdist of the installed llama-cpp-python (cmake, server target only, cached under
  the work dir), run as `llama-server -np 16 -c 16384 -t THREADS`.
Each level (1 and 16 concurrent clients) streams 48-token completions (end of text banned so every request makes
the same number of tokens), seeded, in each workload: `sampled` (temperature 0.8 over the whole vocabulary, as
OpenAI's defaults mean; llama-server is sent `top_k: 0, top_p: 1, min_p: 0`), `greedy`, and for llama-server
also `own-chain` (temperature 0.8 through its default top_k 40, top_p 0.95, min_p 0.05). Prints aggregate
tokens/s, time to first token p50/p99 and inter-token gap p99 per server, workload and level, RSS, the time from
start to `/health` 200, issue 33's targets, and how many of 16 greedy and 16 seeded completions run together equal
the same requests run alone; then constrained decoding speed (`constrained.py`).

    python benchmarks/engine.py [--max-tokens 48] [--rounds 2] [--trials 3] [--llama-server PATH]
        [--variant NAME:VAR=VALUE,...] [--skip-by-shape]
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
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
FULL_VOCABULARY = {"top_k": 0, "top_p": 1.0, "min_p": 0.0}  # llama-server's chain cut to OpenAI's semantics
# Workloads: (temperature, extra fields for llama-server). tokenrelay is sent the temperature alone.
WORKLOADS = {"sampled": (0.8, FULL_VOCABULARY), "greedy": (0.0, {}), "own-chain": (0.8, {})}
PEER = "llama-server"


@dataclass
class Result:
    tokens: int
    seconds: float
    ttfts: list[float]
    gaps: list[float]  # seconds between successive text chunks of a stream

    @property
    def tok_s(self) -> float:
        return self.tokens / self.seconds


@dataclass
class Server:
    name: str
    process: subprocess.Popen[bytes]
    base: str
    startup: float  # seconds from start to /health 200
    workloads: tuple[str, ...] = ("sampled", "greedy")
    runs: dict[tuple[str, int], list[Result]] = field(default_factory=dict)
    rss: float = 0.0  # MiB, the most seen after a trial


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def start(name: str, command: list[str], logs: Path, env: dict[str, str] | None = None) -> Server:
    port = int(command[command.index("--port") + 1])
    log = logs / f"{name}.log"
    started = time.monotonic()
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
                return Server(name, process, f"http://127.0.0.1:{port}", time.monotonic() - started)
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    process.kill()
    raise RuntimeError(f"{name} did not start")


Stream = tuple[int, float, str, list[float]]  # completion tokens, time to first token, text, inter-token gaps


async def one(client: httpx.AsyncClient, body: dict[str, object]) -> Stream:
    """One streamed completion.

    llama-server closes idle keep-alive connections on its own schedule, so a request sent on a connection it
    has just closed fails before any answer: such a request is sent once more, on a new connection."""
    try:
        return await _one(client, body)
    except httpx.RemoteProtocolError:
        return await _one(client, body)


async def _one(client: httpx.AsyncClient, body: dict[str, object]) -> Stream:
    started = time.perf_counter()
    arrivals, text = [], []
    async with client.stream("POST", "/v1/completions", json=body | {"stream": True}) as response:
        async for line in response.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            choices = json.loads(line[6:]).get("choices") or [{}]
            piece = choices[0].get("text") or ""
            if piece:
                arrivals.append(time.perf_counter())
            text.append(piece)
    ttft = arrivals[0] - started if arrivals else float("nan")
    gaps = [b - a for a, b in itertools.pairwise(arrivals)]
    # Both servers send one chunk per generated token (and no end of text is allowed): tokens = chunks with text.
    return sum(1 for piece in text if piece), ttft, "".join(text), gaps


def body(prompt: str, max_tokens: int, seed: int | None, temperature: float, extra: dict[str, object]) -> dict:
    out: dict[str, object] = {"model": MODEL, "prompt": prompt, "max_tokens": max_tokens, "logit_bias": NO_EOS}
    out["temperature"] = temperature
    if seed is not None:
        out["seed"] = seed
    return out | extra


def workload_fields(server: Server, workload: str) -> tuple[float, dict[str, object]]:
    temperature, extra = WORKLOADS[workload]
    return temperature, extra if server.name == PEER else {}


async def run_level(
    base: str,
    concurrency: int,
    max_tokens: int,
    rounds: int,
    temperature: float,
    extra: dict,
    prompts: list[str] = PROMPTS,
    warm_up: list[str] | None = None,
) -> Result:
    """`concurrency` streaming clients, `rounds` requests each, after a warm-up request per client (with the
    `warm_up` prompts, by default the measured ones)."""
    warm_up = prompts if warm_up is None else warm_up
    work = [body(prompts[i % len(prompts)], max_tokens, i, temperature, extra) for i in range(concurrency * rounds)]
    outs: list[Stream] = []

    async def worker(client: httpx.AsyncClient) -> None:
        while work:
            outs.append(await one(client, work.pop()))

    limits = httpx.Limits(max_connections=concurrency + 1)
    async with httpx.AsyncClient(base_url=base, timeout=600, limits=limits) as client:
        # Warm-up: one short request per client, together. The first burst a server meets after its start is slower
        # on either server (a time to first token tail in the first trial only), which is not what steady traffic sees.
        await asyncio.gather(
            *(one(client, body(warm_up[i % len(warm_up)], 2, i, temperature, extra)) for i in range(concurrency))
        )
        started = time.perf_counter()
        await asyncio.gather(*(worker(client) for _ in range(concurrency)))
        seconds = time.perf_counter() - started
    return Result(sum(o[0] for o in outs), seconds, [o[1] for o in outs], [g for o in outs for g in o[3]])


def trial(server: Server, workload: str, level: int, args: argparse.Namespace) -> None:
    temperature, extra = workload_fields(server, workload)
    result = asyncio.run(run_level(server.base, level, args.max_tokens, args.rounds, temperature, extra))
    server.runs.setdefault((workload, level), []).append(result)
    server.rss = max(server.rss, rss_mib(server.process.pid))
    print(
        f"  {server.name:<22} {workload:<9} c={level:<3} {result.tok_s:7.1f} tok/s"
        f"  ttft p50 {pct(result.ttfts, 0.5):6.0f} ms  p99 {pct(result.ttfts, 0.99):6.0f} ms"
        f"  itl p99 {pct(result.gaps, 0.99):5.0f} ms",
        flush=True,
    )


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000 if ordered else float("nan")


async def texts(base: str, bodies: list[dict[str, object]], together: bool) -> list[str]:
    async with httpx.AsyncClient(base_url=base, timeout=600, limits=httpx.Limits(max_connections=17)) as client:
        if together:
            return [o[2] for o in await asyncio.gather(*(one(client, b) for b in bodies))]
        return [(await one(client, b))[2] for b in bodies]


def identical(server: Server, max_tokens: int, seeded: bool) -> int:
    """How many of 16 completions (greedy, or sampled with a seed) run together equal the same request alone."""
    bodies = [
        body(p, max_tokens, 1000 + i if seeded else None, 0.8 if seeded else 0.0, {}) for i, p in enumerate(PROMPTS)
    ]
    alone = asyncio.run(texts(server.base, bodies, together=False))
    together = asyncio.run(texts(server.base, bodies, together=True))
    return sum(a == b for a, b in zip(alone, together, strict=True))


def variant(text: str) -> tuple[str, dict[str, str]]:
    """`NAME:VAR=VALUE,VAR=VALUE` -> (NAME, {VAR: VALUE})."""
    name, _, assignments = text.partition(":")
    return name, dict(item.split("=", 1) for item in assignments.split(",") if item)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--rounds", type=int, default=2, help="requests per client in one trial")
    parser.add_argument("--trials", type=int, default=3, help="alternating trials per server and level (medians)")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 2)
    parser.add_argument("--llama-server", type=Path, default=None, help="a llama-server binary (default: build one)")
    parser.add_argument("--work-dir", type=Path, default=ROOT / ".bench-work", help="where the peer build is kept")
    parser.add_argument("--variant", type=variant, action="append", default=[], help="NAME:VAR=VALUE,... (repeatable)")
    parser.add_argument("--skip-by-shape", action="store_true", help="leave out tokenrelay-by-shape")
    args = parser.parse_args()
    data = shared_data_dir()
    gguf = ensure_default_model(data)
    binary = args.llama_server or llama_server_binary(args.work_dir)
    logs = Path(tempfile.mkdtemp(prefix="bench-engine-"))
    print(time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), " ".join(sys.argv[1:]), flush=True)
    servers: list[Server] = []
    try:
        servers.append(start_tokenrelay("tokenrelay", data, gguf, logs, args, {}))
        for name, env in args.variant:
            servers.append(start_tokenrelay(name, data, gguf, logs, args, env))
        if not args.skip_by_shape:
            servers.append(start_tokenrelay("tokenrelay-by-shape", data, gguf, logs, args, KERNELS_BY_SHAPE))
        servers.append(start_llama_server(binary, gguf, logs, args))
        # All servers stay up and take turns, trial by trial: load from elsewhere on a shared machine then
        # falls on each alike, and the medians compare like with like.
        for level in LEVELS:
            for _ in range(args.trials):
                for server in servers:
                    for workload in server.workloads:
                        trial(server, workload, level, args)
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
    print(
        f"{name}: {health['slots']} slots, kernel invariance probe={health['kernel_invariance_probe']},"
        f" /health 200 after {server.startup:.1f} s",
        flush=True,
    )
    return server


def start_llama_server(
    binary: Path, gguf: Path, logs: Path, args: argparse.Namespace, parallel: int = 16, context: int = 16384
) -> Server:
    port = free_port()
    command = [str(binary), "-m", str(gguf), "--host", "127.0.0.1", "--port", str(port), "--alias", MODEL]
    command += ["-np", str(parallel), "-c", str(context), "-t", str(args.threads)]
    if "amx_int8" in cpu_flags():
        command.append("--no-repack")  # its native build dies on CPUs that advertise AMX but fault on it
    server = start(PEER, command, logs)
    server.workloads = ("sampled", "greedy", "own-chain")
    return server


def median_tok_s(server: Server, workload: str, level: int) -> float:
    return statistics.median(r.tok_s for r in server.runs[workload, level])


def pooled(server: Server, workload: str, level: int, what: str) -> list[float]:
    return [value for r in server.runs[workload, level] for value in getattr(r, what)]


def level_cells(server: Server, workload: str, level: int) -> str:
    ttfts, gaps = pooled(server, workload, level, "ttfts"), pooled(server, workload, level, "gaps")
    tok_s = median_tok_s(server, workload, level)
    return f"{tok_s:>13.1f}{pct(ttfts, 0.5):>9.0f}{pct(ttfts, 0.99):>7.0f}{pct(gaps, 0.99):>9.0f}"


def report(servers: list[Server], invariance: dict[str, tuple[int, int]], constrained: list[str]) -> None:
    header = "".join(f"{'c=' + str(c) + ' tok/s':>13}{'ttft p50':>9}{'p99':>7}{'itl p99':>9}" for c in LEVELS)
    print(f"\nmedians of {len(servers[0].runs['sampled', 1])} alternating trials; latency percentiles over all trials")
    print(f"{'':<34}{header}{'RSS MiB':>9}{'start s':>9}{'identical greedy/seeded':>26}")
    for server in servers:
        greedy, seeded = invariance[server.name]
        for workload in server.workloads:
            cells = "".join(level_cells(server, workload, c) for c in LEVELS)
            print(
                f"{server.name + ' ' + workload:<34}{cells}{server.rss:>9.0f}{server.startup:>9.1f}"
                f"{f'{greedy}/16 / {seeded}/16':>26}"
            )
    peer = next(s for s in servers if s.name == PEER)
    for server in (s for s in servers if s.name.startswith("tokenrelay") and s.name != "tokenrelay-by-shape"):
        print(f"\n{server.name} against issue 33's targets:")
        targets(server, peer, invariance[server.name])
    by_shape = next((s for s in servers if s.name == "tokenrelay-by-shape"), None)
    if by_shape is not None:
        for level in LEVELS:
            cost = ratio(servers[0], by_shape, "sampled", "sampled", level)
            print(f"tokenrelay / tokenrelay-by-shape sampled at c={level:<2}: {cost}")
    print("\n".join(constrained))


TARGETS = (  # (our workload, llama-server's, level, lowest ratio)
    ("sampled", "sampled", 16, 1.10),
    ("sampled", "sampled", 1, 1.0),
    ("greedy", "greedy", 16, 1.0),
    ("greedy", "greedy", 1, 1.0),
    ("sampled", "own-chain", 16, 0.95),
    ("sampled", "own-chain", 1, 0.95),
)


def targets(server: Server, peer: Server, invariance: tuple[int, int]) -> None:
    for ours, theirs, level, lowest in TARGETS:
        met = median_tok_s(server, ours, level) / median_tok_s(peer, theirs, level) >= lowest
        shown = ratio(server, peer, ours, theirs, level)
        print(f"  {ours} / {PEER} {theirs} at c={level:<2}: {shown}  {verdict(met)} (>= {lowest}x)")
    ttft = [pct(pooled(s, "sampled", 16, "ttfts"), 0.99) for s in (server, peer)]
    print(f"  ttft p99 sampled c=16: {ttft[0]:.0f} ms vs {ttft[1]:.0f} ms  {verdict(ttft[0] <= ttft[1])} (<= {PEER}'s)")
    print(f"  identical greedy / seeded: {invariance[0]}/16, {invariance[1]}/16  {verdict(invariance == (16, 16))}")
    print(f"  RSS {server.rss:.0f} MiB  {verdict(server.rss <= 1200)} (<= 1.2 GB)")
    print(f"  start to /health 200: {server.startup:.1f} s  {verdict(server.startup < 10)} (< 10 s)")


def verdict(met: bool) -> str:
    return "met" if met else "NOT met"


def ratio(a: Server, b: Server, ours: str, theirs: str, level: int) -> str:
    pairs = zip(a.runs[ours, level], b.runs[theirs, level], strict=True)
    trials = ", ".join(f"{x.tok_s / y.tok_s:.2f}" for x, y in pairs)
    return f"{median_tok_s(a, ours, level) / median_tok_s(b, theirs, level):.2f}x (per trial {trials})"


if __name__ == "__main__":
    main()
