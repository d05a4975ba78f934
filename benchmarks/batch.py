"""Batch jobs on the embedded engine: what a running batch costs interactive clients, and how fast a batch runs.

One `tokenrelay serve` on the default Gemma model (default settings, a database of its own), two parts:
- Interference: `--clients` streaming clients (48-token completions, end of text banned, seeded, temperature
  0.8), on an idle server and with a `--lines`-line batch of the same kind of request running, alternating
  trial by trial (the batch is cancelled after each busy trial). Each trial's prompts are new to the server.
  Issue 35's targets: time to first token p50 within 1.5x of idle, tokens/s at least 0.8x of idle.
- Throughput: a `--throughput-lines`-line batch on an otherwise idle server, from `POST /v1/batches` to its
  end, against the same requests sent by 16 concurrent streaming clients, alternating. Target: >= 0.9x.

    python benchmarks/batch.py [--lines 2000] [--throughput-lines 128] [--clients 4] [--trials 3]
        [--env TOKENRELAY_VAR=VALUE ...]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx

from engine import MODEL, PROMPTS, Result, Server, body, pct, run_level, start

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "tests" / "support"))

from servers import free_port, shared_data_dir  # noqa: E402

from tokenrelay.backends.llamacpp.default_model import ensure_default_model  # noqa: E402

TEMPERATURE = 0.8
ENDED = ("completed", "failed", "expired", "cancelled")


def batch_input(lines: int, max_tokens: int) -> bytes:
    rows = []
    for i in range(lines):
        request = body(PROMPTS[i % len(PROMPTS)], max_tokens, 10_000 + i, TEMPERATURE, {})
        rows.append({"custom_id": f"line-{i}", "method": "POST", "url": "/v1/completions", "body": request})
    return "\n".join(json.dumps(row) for row in rows).encode()


def create_batch(client: httpx.Client, content: bytes) -> str:
    uploaded = client.post("/v1/files", files={"file": ("input.jsonl", content)}, data={"purpose": "batch"})
    uploaded.raise_for_status()
    batch = {"input_file_id": uploaded.json()["id"], "endpoint": "/v1/completions", "completion_window": "24h"}
    created = client.post("/v1/batches", json=batch)
    created.raise_for_status()
    return created.json()["id"]


def wait_for(client: httpx.Client, batch_id: str, done: int | None = None, timeout: float = 3600) -> dict:
    """The batch once it has ended (or, with `done`, once that many lines are answered)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        batch = client.get(f"/v1/batches/{batch_id}").json()
        counts = batch.get("request_counts") or {"completed": 0, "failed": 0}
        if batch["status"] in ENDED or (done is not None and counts["completed"] + counts["failed"] >= done):
            return batch
        time.sleep(0.25)  # a poll costs the server a little: no faster than a client would
    raise RuntimeError(f"batch {batch_id} did not get there in {timeout} s")


def fresh_prompts(tag: str) -> list[str]:
    """Prompts that no earlier request sent. With the same prompts in every trial, an idle server answers them
    from the caches of all its slots, while a running batch holds most slots: the comparison would measure the
    prefix cache, not the batch's interference."""
    return [f"{tag}. {prompt}" for prompt in PROMPTS]


def interactive(server: Server, args: argparse.Namespace, tag: str) -> Result:
    prompts, warm_up = fresh_prompts(tag), fresh_prompts(f"{tag}, warm-up")
    clients, tokens, rounds = args.clients, args.max_tokens, args.rounds
    return asyncio.run(run_level(server.base, clients, tokens, rounds, TEMPERATURE, {}, prompts, warm_up))


def busy_trial(server: Server, client: httpx.Client, args: argparse.Namespace, tag: str) -> Result:
    batch_id = create_batch(client, batch_input(args.lines, args.max_tokens))
    wait_for(client, batch_id, done=4)  # lines are flowing
    result = interactive(server, args, tag)
    client.post(f"/v1/batches/{batch_id}/cancel").raise_for_status()
    wait_for(client, batch_id)
    return result


def batch_tok_s(client: httpx.Client, args: argparse.Namespace) -> float:
    started = time.perf_counter()
    batch = wait_for(client, create_batch(client, batch_input(args.throughput_lines, args.max_tokens)))
    seconds = time.perf_counter() - started
    assert batch["status"] == "completed", batch
    return batch["usage"]["output_tokens"] / seconds


def report(label: str, values: list[float], unit: str) -> float:
    middle = statistics.median(values)
    print(f"  {label:<44} median {middle:8.1f} {unit}  ({', '.join(f'{v:.1f}' for v in values)})", flush=True)
    return middle


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--lines", type=int, default=2000, help="lines of the batch running during busy trials")
    parser.add_argument("--throughput-lines", type=int, default=128)
    parser.add_argument("--clients", type=int, default=4, help="interactive streaming clients")
    parser.add_argument("--rounds", type=int, default=2, help="requests per interactive client in one trial")
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 2)
    parser.add_argument("--env", action="append", default=[], help="VAR=VALUE for the server (repeatable)")
    args = parser.parse_args()
    data = shared_data_dir()
    gguf = ensure_default_model(data)
    work = Path(tempfile.mkdtemp(prefix="bench-batch-"))
    command = [sys.executable, "-m", "tokenrelay", "serve", "--port", str(free_port()), "--data-dir", str(data)]
    command += ["--model", str(gguf), "--model-id", MODEL, "--threads", str(args.threads)]
    command += ["--database-url", f"sqlite:///{work / 'bench.db'}"]
    print(time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), " ".join(sys.argv[1:]), flush=True)
    print("server settings:", " ".join(args.env) or "defaults", flush=True)
    server = start("tokenrelay", command, work, dict(item.split("=", 1) for item in args.env))
    try:
        with httpx.Client(base_url=server.base, timeout=600) as client:
            run(server, client, args)
    finally:
        server.process.terminate()
        server.process.wait(timeout=60)


def run(server: Server, client: httpx.Client, args: argparse.Namespace) -> None:
    print(f"interference: {args.clients} streaming clients, idle vs a {args.lines}-line batch running", flush=True)
    idle, busy = [], []
    for trial in range(args.trials):
        idle.append(interactive(server, args, f"Trial {trial + 1}, idle"))
        busy.append(busy_trial(server, client, args, f"Trial {trial + 1}, busy"))
        for name, result in (("idle", idle[-1]), ("busy", busy[-1])):
            print(f"  trial {trial + 1} {name}: {result.tok_s:6.1f} tok/s  ttft p50 {pct(result.ttfts, 0.5):6.0f} ms")
    ttft_idle = report("ttft p50, idle", [pct(r.ttfts, 0.5) for r in idle], "ms")
    ttft_busy = report("ttft p50, batch running", [pct(r.ttfts, 0.5) for r in busy], "ms")
    tok_idle = report("tok/s, idle", [r.tok_s for r in idle], "tok/s")
    tok_busy = report("tok/s, batch running", [r.tok_s for r in busy], "tok/s")

    lines = args.throughput_lines
    print(f"throughput: a {lines}-line batch vs the same requests from 16 streaming clients", flush=True)
    alone, clients = [], []
    for _ in range(args.trials):
        alone.append(batch_tok_s(client, args))
        rounds = max(1, lines // 16)
        clients.append(asyncio.run(run_level(server.base, 16, args.max_tokens, rounds, TEMPERATURE, {})).tok_s)
    batch_rate = report("batch", alone, "tok/s")
    client_rate = report("16 clients", clients, "tok/s")

    print("targets (issue 35):")
    print(f"  ttft p50 with a batch running / idle: {ttft_busy / ttft_idle:.2f}x (target <= 1.5x)")
    print(f"  tok/s with a batch running / idle:    {tok_busy / tok_idle:.2f}x (target >= 0.8x)")
    print(f"  batch tok/s / 16 clients' tok/s:      {batch_rate / client_rate:.2f}x (target >= 0.9x)")


if __name__ == "__main__":
    main()
