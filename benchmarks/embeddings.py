"""Embeddings per second: tokenrelay vs llama.cpp's own `llama-server --embeddings`, same GGUF, same requests.

Both serve the default Gemma model: tokenrelay with its default engine settings (`embedding_batch` 64),
`llama-server` built from the sdist of the installed llama-cpp-python (see `peer_build.py`) and run as
`llama-server --embeddings --pooling mean -np 16 -c 16384 -b 2048 -ub 2048 -t THREADS` (mean pooling and L2
normalisation, as tokenrelay does for a model that declares no pooling). One client sends requests of 1, 16 and
64 short texts back to back; the servers take turns round by round, and the medians of the rounds are compared.
Also prints how close the two servers' vectors are (cosine similarity; they differ in kernels, not in method).

    python benchmarks/embeddings.py [--rounds 5] [--inputs 256] [--llama-server PATH]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "tests" / "support"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from servers import free_port, shared_data_dir  # noqa: E402

from engine import MODEL, Server, rss_mib, start  # noqa: E402  (a sibling script: its server helpers)
from peer_build import llama_server_binary  # noqa: E402
from tokenrelay.backends.llamacpp.cpu import cpu_flags  # noqa: E402
from tokenrelay.backends.llamacpp.default_model import ensure_default_model  # noqa: E402

BATCHES = (1, 16, 64)
WORDS = ("river", "mountain", "glass", "clock", "bee", "salt", "wind", "lantern")
WORDS += ("snow", "copper", "owl", "fern", "ship", "bell", "moss", "star")


def texts(count: int, offset: int = 0) -> list[str]:
    """Short sentences (8 to 12 tokens), all different."""
    return [
        f"A {WORDS[(i + offset) % 16]} near the {WORDS[(3 * i + offset) % 16]} at hour {i + offset}."
        for i in range(count)
    ]


def embed(client: httpx.Client, inputs: list[str]) -> list[np.ndarray]:
    answer = client.post("/v1/embeddings", json={"model": MODEL, "input": inputs, "encoding_format": "float"})
    answer.raise_for_status()
    data = sorted(answer.json()["data"], key=lambda item: item["index"])
    return [np.asarray(item["embedding"], dtype=np.float32) for item in data]


def rate(server: Server, batch: int, inputs: int) -> float:
    """Embeddings per second for `inputs` texts sent `batch` at a time, one request after the other."""
    with httpx.Client(base_url=server.base, timeout=600) as client:
        embed(client, texts(batch, offset=10_000))  # warm-up
        started = time.perf_counter()
        for first in range(0, inputs, batch):
            embed(client, texts(batch, offset=first))
        return inputs / (time.perf_counter() - started)


def similarity(servers: list[Server]) -> float:
    sample = texts(16, offset=500)
    with httpx.Client(base_url=servers[0].base, timeout=600) as a, httpx.Client(base_url=servers[1].base) as b:
        ours, theirs = embed(a, sample), embed(b, sample)
    return min(float(np.dot(x, y) / (np.linalg.norm(x) * np.linalg.norm(y))) for x, y in zip(ours, theirs, strict=True))


def start_tokenrelay(data: Path, gguf: Path, logs: Path, threads: int) -> Server:
    port = free_port()
    command = [sys.executable, "-m", "tokenrelay", "serve", "--port", str(port), "--data-dir", str(data)]
    command += ["--model", str(gguf), "--model-id", MODEL, "--threads", str(threads)]
    return start("tokenrelay", command, logs)


def start_llama_server(binary: Path, gguf: Path, logs: Path, threads: int) -> Server:
    port = free_port()
    command = [str(binary), "-m", str(gguf), "--host", "127.0.0.1", "--port", str(port), "--alias", MODEL]
    command += ["--embeddings", "--pooling", "mean", "-np", "16", "-c", "16384", "-b", "2048", "-ub", "2048"]
    command += ["-t", str(threads)]
    if "amx_int8" in cpu_flags():
        command.append("--no-repack")  # its native build dies on CPUs that advertise AMX but fault on it
    return start("llama-server", command, logs)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=5, help="alternating rounds per server and batch size")
    parser.add_argument("--inputs", type=int, default=256, help="texts embedded per round")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 2)
    parser.add_argument("--llama-server", type=Path, default=None, help="a llama-server binary (default: build one)")
    parser.add_argument("--work-dir", type=Path, default=ROOT / ".bench-work", help="where the peer build is kept")
    args = parser.parse_args()
    gguf = ensure_default_model(shared_data_dir())
    binary = args.llama_server or llama_server_binary(args.work_dir)
    logs = Path(tempfile.mkdtemp(prefix="bench-embeddings-"))
    servers: list[Server] = []
    rates: dict[tuple[str, int], list[float]] = {}
    try:
        servers.append(start_tokenrelay(shared_data_dir(), gguf, logs, args.threads))
        servers.append(start_llama_server(binary, gguf, logs, args.threads))
        for number in range(args.rounds):
            for batch in BATCHES:
                for server in servers if number % 2 == 0 else servers[::-1]:
                    figure = rate(server, batch, args.inputs)
                    rates.setdefault((server.name, batch), []).append(figure)
                    rss = rss_mib(server.process.pid)
                    line = f"round {number} batch {batch:<3} {server.name:<13} {figure:8.1f} emb/s  rss {rss:5.0f} MiB"
                    print(f"  {line}", flush=True)
        cosine = similarity(servers)
    finally:
        for server in servers:
            server.process.terminate()
            server.process.wait()
    print(f"\nmedians of {args.rounds} alternating rounds, {args.inputs} texts a round, {args.threads} threads")
    for batch in BATCHES:
        ours, theirs = (statistics.median(rates[(s.name, batch)]) for s in servers)
        figures = f"tokenrelay {ours:8.1f} emb/s  llama-server {theirs:8.1f} emb/s"
        print(f"batch {batch:<3} {figures}  ratio {ours / theirs:.2f}x")
    print(f"lowest cosine similarity between the two servers' vectors of 16 texts: {cosine:.6f}")


if __name__ == "__main__":
    main()
