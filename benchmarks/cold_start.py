"""Time to first token of a model that is not loaded: tokenrelay's on-demand loading vs llama-server's router mode.

Both serve the same folder of three GGUFs (the default Gemma 3 270M and SmolLM2-135M twice, under two names) with
at most two loaded, so a request cycling through the three always finds its model unloaded (the least recently
used one makes room). Settings that change the work are pinned on both sides: 4 slots of 1,024 tokens (tokenrelay
`--slots 4 --ctx-size 1024`, no long slot; llama-server `-np 4 -c 4096`), the same threads. Each round sends, to
each server in turn, one streamed completion (8 tokens, greedy) per model in the cycle (cold), then one more to the
last model (warm). A first round (each file's first load in this run) is reported apart. Prints the median TTFT of
each kind per server, the cold ratio, and RSS. The files are read from the page cache on both sides.

    python benchmarks/cold_start.py [--rounds 3] [--threads 2] [--llama-server PATH]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
from pathlib import Path

import httpx
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from engine import Server, cpu_flags, free_port, one, rss_mib, start
from peer_build import llama_server_binary
from tokenrelay.backends.llamacpp.default_model import ensure_default_model, smollm2_path

ROOT = Path(__file__).resolve().parents[1]
MODELS = ("gemma", "smol-a", "smol-b")


def model_folder(folder: Path, data: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    sources = {"gemma": ensure_default_model(data), "smol-a": smollm2_path(data), "smol-b": smollm2_path(data)}
    for name, source in sources.items():
        (folder / f"{name}.gguf").symlink_to(source)
        source.read_bytes()  # into the page cache: both servers then load from memory, not the disk
    return folder


def start_tokenrelay(folder: Path, work: Path, threads: int) -> Server:
    config = {
        "models": [],
        "models_dir": str(folder),
        "engine": {"slots": 4, "ctx_per_slot": 1024, "long_slots": 0, "max_loaded_models": 2, "threads": threads},
    }
    config_file = work / "tokenrelay.yaml"
    config_file.write_text(yaml.safe_dump(config))
    command = [sys.executable, "-m", "tokenrelay", "serve", "--port", str(free_port()), "--data-dir", str(work)]
    return start("tokenrelay", [*command, "--config", str(config_file)], work)


def start_router(binary: Path, folder: Path, work: Path, threads: int) -> Server:
    command = [str(binary), "--models-dir", str(folder), "--models-max", "2", "--host", "127.0.0.1"]
    command += ["--port", str(free_port()), "-np", "4", "-c", "4096", "-t", str(threads)]
    if "amx_int8" in cpu_flags():
        command.append("--no-repack")  # its native build dies on CPUs that advertise AMX but fault on it
    return start("llama-server", command, work)


async def first_token(server: Server, model: str) -> float:
    body = {"model": model, "prompt": "Once upon a time", "max_tokens": 8, "temperature": 0, "stream": True}
    async with httpx.AsyncClient(base_url=server.base, timeout=600) as client:
        _tokens, ttft, _text, _gaps = await one(client, body)
    return ttft


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--llama-server", type=Path)
    args = parser.parse_args()
    binary = args.llama_server or llama_server_binary(ROOT / ".bench-work")
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        folder = model_folder(work / "models", ROOT / ".bench-work" / "data")
        servers = [start_tokenrelay(folder, work, args.threads), start_router(binary, folder, work, args.threads)]
        cold: dict[str, list[float]] = {s.name: [] for s in servers}
        warm: dict[str, list[float]] = {s.name: [] for s in servers}
        first: dict[str, list[float]] = {s.name: [] for s in servers}
        try:
            for round_number in range(args.rounds + 1):
                for server in servers:
                    # The first round loads each file for the first time: tokenrelay's start-up invariance probe
                    # runs then (its verdict is kept in the data dir), so it is reported apart.
                    samples = first if round_number == 0 else cold
                    for model in MODELS:
                        samples[server.name].append(asyncio.run(first_token(server, model)))
                    warm[server.name].append(asyncio.run(first_token(server, MODELS[-1])))
                    server.rss = max(server.rss, rss_mib(server.process.pid))
        finally:
            for server in servers:
                server.process.terminate()
                server.process.wait(timeout=60)
    header = f"{'server':<14}{'first load':>14}{'cold TTFT p50':>16}{'warm TTFT p50':>16}{'RSS MiB':>10}"
    print(f"{header}  (then {args.rounds} rounds x 3 models)")
    for server in servers:
        name = server.name
        first_ms = statistics.median(first[name]) * 1e3
        cold_ms, warm_ms = statistics.median(cold[name]) * 1e3, statistics.median(warm[name]) * 1e3
        print(f"{name:<14}{first_ms:>12,.0f}ms{cold_ms:>14,.0f}ms{warm_ms:>14,.0f}ms{server.rss:>10,.0f}")
    ours, theirs = (statistics.median(cold[s.name]) for s in servers)
    print(f"cold TTFT ratio tokenrelay / llama-server router: {ours / theirs:.2f}x")
    print("(llama-server's router runs each model in a child process: its RSS above is the router's alone)")


if __name__ == "__main__":
    main()
