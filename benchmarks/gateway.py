"""Gateway overhead, side by side: a fast mock node called directly, through tokenrelay, and through LiteLLM's proxy.

Run from a checkout: `python benchmarks/gateway.py` (needs `wrk` on PATH: `apt-get install wrk`). It starts
the mock node (`benchmarks/mock_node.py`), tokenrelay gateways with it as their one upstream (this checkout's `src`;
one process, and `--workers 2`: see --workers),
and LiteLLM's proxy in its own virtual environment (created on first run under --work-dir, then reused;
master key set, one worker), all on loopback. Each is loaded with wrk for non-streamed and streamed chat
completions at concurrency 1 and 64 (with --rounds N, N times over, the targets taking turns, and each figure
the median of its N), and the requests/s and p50/p99 latencies are printed side by side, with
the CPU time each target spent per request (its processes' user + system time over the measured run, read
from /proc: a figure less at the mercy of a shared machine's noise than requests/s).
Not part of the test run: figures depend on the machine and on whatever else it is doing.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
import yaml

ROOT = Path(__file__).resolve().parents[1]
MASTER_KEY = "sk-bench-master-key"
MESSAGES = [{"role": "user", "content": "Say something about foxes."}]
_UNITS = {"us": 1e-3, "ms": 1.0, "s": 1000.0}


@dataclass(frozen=True)
class Target:
    name: str
    url: str  # .../v1/chat/completions
    model: str
    key: str | None = None
    pid: int | None = None  # the serving process (its children, the workers, are counted with it)


@dataclass(frozen=True)
class Result:
    target: str
    stream: bool
    connections: int
    rps: float
    p50_ms: float
    p99_ms: float
    errors: int
    cpu_us: float | None  # CPU time of the target's processes per request, in microseconds
    node_cpu_us: float | None = None  # the same for another process watched over the same run (`run_wrk`'s node_pid)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextmanager
def process(command: list[str], log: Path, env: dict[str, str] | None = None) -> Iterator[subprocess.Popen[bytes]]:
    with log.open("wb") as out:
        proc = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})})
    try:
        yield proc
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def wait_until_serving(target: Target, log: Path, timeout: float = 180) -> None:
    """Poll with a real request until the target answers 200 with content."""
    headers = {"Authorization": f"Bearer {target.key}"} if target.key else {}
    body = {"model": target.model, "messages": MESSAGES, "max_tokens": 16}
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            response = httpx.post(target.url, json=body, headers=headers, timeout=10)
            if response.status_code == 200 and response.json()["choices"][0]["message"]["content"]:
                return
        except (httpx.HTTPError, KeyError, ValueError):
            pass
        time.sleep(0.5)
    raise RuntimeError(f"{target.name} did not start; see {log}:\n{log.read_text(errors='replace')[-3000:]}")


def lua_script(target: Target, stream: bool, directory: Path) -> Path:
    body = {"model": target.model, "messages": MESSAGES, "max_tokens": 16, "stream": stream}
    lines = ['wrk.method = "POST"', f"wrk.body = {json.dumps(json.dumps(body))}"]
    lines.append('wrk.headers["Content-Type"] = "application/json"')
    if target.key:
        lines.append(f'wrk.headers["Authorization"] = "Bearer {target.key}"')
    path = directory / f"{target.name}-{'stream' if stream else 'json'}.lua"
    path.write_text("\n".join(lines) + "\n")
    return path


def cpu_seconds(pid: int) -> float:
    """User + system time of a process and its live children (uvicorn's workers), from /proc."""
    ticks = os.sysconf("SC_CLK_TCK")
    total = 0.0
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue  # a process that ended while we looked
        if stat.parent.name == str(pid) or fields[1] == str(pid):  # fields[1]: the parent pid
            total += (int(fields[11]) + int(fields[12])) / ticks
    return total


def run_wrk(
    target: Target, stream: bool, connections: int, seconds: int, directory: Path, node_pid: int | None = None
) -> Result:
    """One wrk run after a 2 s warm-up; CPU per request is counted over the measured run only, for the target
    and, given `node_pid`, for that process too (the node behind a gateway)."""
    script = lua_script(target, stream, directory)
    threads = min(connections, 2)
    warmup = ["wrk", f"-t{threads}", f"-c{connections}", "-d2s", "-s", str(script), target.url]
    subprocess.run(warmup, capture_output=True, check=True)
    # A generous per-request timeout, so that a slow gateway is measured as slow rather than as failing.
    command = ["wrk", f"-t{threads}", f"-c{connections}", f"-d{seconds}s", "--timeout", "30s", "--latency"]
    command += ["-s", str(script)]
    cpu_before = cpu_seconds(target.pid) if target.pid else None
    node_before = cpu_seconds(node_pid) if node_pid else None
    output = subprocess.run([*command, target.url], capture_output=True, text=True, check=True).stdout
    requests = int(re.search(r"(\d+) requests in", output).group(1))
    cpu_us = node_cpu_us = None
    if cpu_before is not None and requests:
        cpu_us = (cpu_seconds(target.pid) - cpu_before) / requests * 1e6
    if node_before is not None and requests:
        node_cpu_us = (cpu_seconds(node_pid) - node_before) / requests * 1e6  # type: ignore[arg-type]
    return Result(
        target=target.name,
        stream=stream,
        connections=connections,
        rps=float(re.search(r"Requests/sec:\s+([\d.]+)", output).group(1)),
        p50_ms=_percentile(output, "50"),
        p99_ms=_percentile(output, "99"),
        errors=_errors(output),
        cpu_us=cpu_us,
        node_cpu_us=node_cpu_us,
    )


def _percentile(output: str, which: str) -> float:
    match = re.search(rf"^\s+{which}%\s+([\d.]+)(us|ms|s)\s*$", output, re.MULTILINE)
    return float(match.group(1)) * _UNITS[match.group(2)]


def _errors(output: str) -> int:
    non_2xx = re.search(r"Non-2xx or 3xx responses:\s+(\d+)", output)
    socket_errors = re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", output)
    return (int(non_2xx.group(1)) if non_2xx else 0) + (sum(map(int, socket_errors.groups())) if socket_errors else 0)


# The three servers ----------------------------------------------------------------------------------------
def start_mock(stack: ExitStack, work: Path) -> Target:
    port = free_port()
    log = work / "mock-node.log"
    mock = [sys.executable, str(ROOT / "benchmarks" / "mock_node.py"), "--port", str(port)]
    proc = stack.enter_context(process(mock, log))
    target = Target("direct", f"http://127.0.0.1:{port}/v1/chat/completions", "mock", pid=proc.pid)
    wait_until_serving(target, log)
    return target


def start_tokenrelay(
    stack: ExitStack,
    work: Path,
    node: Target,
    key: str | None,
    extra: Path | None,
    workers: int,
    name: str | None = None,
    env: dict[str, str] | None = None,
) -> Target:
    """A tokenrelay with `node` as its one upstream: this checkout's `src` unless `env` names another
    `PYTHONPATH` (`benchmarks/paired.py` runs several source trees side by side)."""
    port = free_port()
    name = name or ("tokenrelay" if workers == 1 else f"tokenrelay-w{workers}")
    upstream = {"url": node.url.removesuffix("/chat/completions"), "name": "mock", "model": "mock"}
    settings = yaml.safe_load(extra.read_text()) if extra else {}
    config = work / f"{name}.yaml"
    config.write_text(yaml.safe_dump(settings | {"models": [{"id": "bench", "upstreams": [upstream]}]}))
    log = work / f"{name}.log"
    data = ["--data-dir", str(work / f"{name}-data")]
    env = {"PYTHONPATH": str(ROOT / "src"), **(env or {})}
    key = key or create_key(data, env)
    command = [sys.executable, "-m", "tokenrelay", "serve", "--port", str(port), "--config", str(config), *data]
    command += ["--workers", str(workers)]
    proc = stack.enter_context(process(command, log, env))
    target = Target(name, f"http://127.0.0.1:{port}/v1/chat/completions", "bench", key, proc.pid)
    wait_until_serving(target, log)
    return target


def create_key(data: list[str], env: dict[str, str]) -> str:
    """A real API key in the gateway's own key store, so the benchmark pays for auth and the ledger."""
    name = f"bench-{int(time.time())}"
    command = [sys.executable, "-m", "tokenrelay", "keys", "create", "--name", name, *data]
    out = subprocess.run(command, check=True, capture_output=True, text=True, env={**os.environ, **env})
    return out.stdout.strip().splitlines()[-1]


def litellm_python(venv: Path) -> Path:
    python = venv / "bin" / "python"
    if not (venv / "bin" / "litellm").exists():
        print(f"installing LiteLLM's proxy into {venv} (first run only) ...", flush=True)
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        subprocess.run([str(python), "-m", "pip", "install", "-q", "litellm[proxy]"], check=True)
    return python


def start_litellm(stack: ExitStack, work: Path, venv: Path, node: Target) -> Target:
    litellm_python(venv)
    port = free_port()
    api_base = node.url.removesuffix("/chat/completions")
    params = {"model": "openai/mock", "api_base": api_base, "api_key": "unused"}
    config = work / "litellm.yaml"
    config.write_text(yaml.safe_dump({"model_list": [{"model_name": "bench", "litellm_params": params}]}))
    log = work / "litellm.log"
    command = [str(venv / "bin" / "litellm"), "--config", str(config), "--port", str(port), "--num_workers", "1"]
    # The cost map is read from the package instead of fetched; no telemetry; quiet logs.
    env = {"LITELLM_MASTER_KEY": MASTER_KEY, "LITELLM_LOCAL_MODEL_COST_MAP": "True", "LITELLM_LOG": "ERROR"}
    proc = stack.enter_context(process(command, log, env))
    target = Target("litellm", f"http://127.0.0.1:{port}/v1/chat/completions", "bench", MASTER_KEY, proc.pid)
    wait_until_serving(target, log)
    return target


# Report ---------------------------------------------------------------------------------------------------
def table(results: list[Result], names: list[str]) -> str:
    by_key = {(r.target, r.stream, r.connections): r for r in results}
    header = f"{'':<18}" + "".join(f"{name:>30}" for name in names)
    sub = f"{'mode':<10}{'conc':>6}  " + "".join(f"{'req/s':>10}{'p50 ms':>10}{'p99 ms':>10}" for _ in names)
    rows = [header, sub]
    for stream in (False, True):
        for connections in (1, 64):
            cells = ""
            for name in names:
                result = by_key.get((name, stream, connections))
                cells += _cells(result)
            rows.append(f"{'stream' if stream else 'json':<10}{connections:>6}  {cells}")
    return "\n".join(rows)


def _cells(result: Result | None) -> str:
    if result is None:
        return f"{'-':>10}{'-':>10}{'-':>10}"
    mark = "!" if result.errors else ""
    return f"{result.rps:>9.0f}{mark:1}{result.p50_ms:>10.2f}{result.p99_ms:>10.2f}"


def medians(results: list[Result]) -> list[Result]:
    """One result per cell: the median of each figure over the rounds (errors summed)."""
    cells: dict[tuple[str, bool, int], list[Result]] = {}
    for result in results:
        cells.setdefault((result.target, result.stream, result.connections), []).append(result)
    merged = []
    for (target, stream, connections), rounds in cells.items():
        cpu = [r.cpu_us for r in rounds if r.cpu_us is not None]
        merged.append(
            Result(
                target=target,
                stream=stream,
                connections=connections,
                rps=statistics.median(r.rps for r in rounds),
                p50_ms=statistics.median(r.p50_ms for r in rounds),
                p99_ms=statistics.median(r.p99_ms for r in rounds),
                errors=sum(r.errors for r in rounds),
                cpu_us=statistics.median(cpu) if cpu else None,
            )
        )
    return merged


def _cpu(result: Result) -> str:
    return "-" if result.cpu_us is None else f"{result.cpu_us:.0f}"


def cpu_table(results: list[Result], names: list[str]) -> str:
    by_key = {(r.target, r.stream, r.connections): r for r in results}
    rows = [f"{'CPU us/request':<18}" + "".join(f"{name:>15}" for name in names)]
    for stream in (False, True):
        for connections in (1, 64):
            cells = "".join(f"{_cpu(by_key[(n, stream, connections)]):>15}" for n in names)
            rows.append(f"{'stream' if stream else 'json':<10}{connections:>6}  {cells}")
    return "\n".join(rows)


def verdicts(results: list[Result], relays: list[str]) -> list[str]:
    by_key = {(r.target, r.stream, r.connections): r for r in results}
    lines = []
    for name in relays:
        for stream in (False, True):
            mode = "stream" if stream else "json"
            direct, relay = by_key.get(("direct", stream, 1)), by_key.get((name, stream, 1))
            if direct and relay:
                lines.append(f"{name} {mode}: adds {relay.p50_ms - direct.p50_ms:.2f} ms at p50 (concurrency 1)")
            direct, relay, lite = (by_key.get((n, stream, 64)) for n in ("direct", name, "litellm"))
            if direct and relay:
                lines.append(f"{name} {mode}: at concurrency 64, {relay.rps / direct.rps:.2f}x the direct req/s")
            if lite and relay:
                lines.append(f"{name} {mode}: at concurrency 64, {relay.rps / lite.rps:.1f}x LiteLLM's req/s")
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=int, default=10, help="length of each measured wrk run")
    parser.add_argument("--work-dir", type=Path, default=Path(tempfile.gettempdir()) / "tokenrelay-bench")
    parser.add_argument("--skip-litellm", action="store_true")
    parser.add_argument("--rounds", type=int, default=1, help="measure every cell this many times; report medians")
    parser.add_argument(
        "--tokenrelay-key", default=None, help="client key for tokenrelay (default: create one in its key store)"
    )
    parser.add_argument("--tokenrelay-config", type=Path, help="extra YAML merged into the gateway's config")
    parser.add_argument(
        "--workers", default="1,2", help="tokenrelay worker counts to measure, comma-separated (default: 1,2)"
    )
    args = parser.parse_args()
    if shutil.which("wrk") is None:
        print("wrk is not installed (Debian: apt-get install wrk)", file=sys.stderr)
        return 2
    args.work_dir.mkdir(parents=True, exist_ok=True)
    results: list[Result] = []
    with ExitStack() as stack:
        node = start_mock(stack, args.work_dir)
        targets = [node]
        for workers in (int(w) for w in args.workers.split(",")):
            targets.append(
                start_tokenrelay(stack, args.work_dir, node, args.tokenrelay_key, args.tokenrelay_config, workers)
            )
        if not args.skip_litellm:
            targets.append(start_litellm(stack, args.work_dir, args.work_dir / "litellm-venv", node))
        for target in (t for _ in range(args.rounds) for t in targets):
            for stream in (False, True):
                for connections in (1, 64):
                    result = run_wrk(target, stream, connections, args.seconds, args.work_dir)
                    print(
                        f"  {target.name:<11} {'stream' if stream else 'json':<7} c={connections:<3} "
                        f"{result.rps:9.0f} req/s  p50 {result.p50_ms:8.2f} ms  p99 {result.p99_ms:8.2f} ms"
                        f"  cpu {_cpu(result)} us/req{'  ERRORS ' + str(result.errors) if result.errors else ''}",
                        flush=True,
                    )
                    results.append(result)
    print()
    results = medians(results)
    rounds = f", medians of {args.rounds} rounds" if args.rounds > 1 else ""
    print(f"wrk, {args.seconds} s per cell after a 2 s warm-up{rounds}, {os.cpu_count()} CPUs; '!' marks errors")
    print(
        "tokenrelay: default settings (tokenrelay-wN: --workers N),"
        " a real API key checked on every request, ledger on (SQLite)"
    )
    print(table(results, [t.name for t in targets]))
    print()
    print(cpu_table(results, [t.name for t in targets]))
    print()
    print("\n".join(verdicts(results, [t.name for t in targets if t.name.startswith("tokenrelay")])))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
