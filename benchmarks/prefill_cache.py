"""A long prompt's evaluation by KV cache precision, in process: the choice behind a long slot's F16 cache.

A Q8_0 cache makes llama.cpp's CPU attention take its row-by-row kernel for every batch shape (batch-invariant
anywhere); an F16 cache lets a prompt piece of 64 rows or more take the tiled kernel. One context of one sequence,
the prompt evaluated in pieces of `--chunk` tokens (as a long slot evaluates it), with the kernels the server uses
(`GGML_CPU_TILED_MM=0`), each measurement in a fresh process, the cache types taking turns; medians of `--trials`.

    python benchmarks/prefill_cache.py [--tokens 4096] [--chunk 512] [--trials 3]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "tests" / "support"))

from servers import shared_data_dir  # noqa: E402

from tokenrelay.backends.llamacpp.default_model import ensure_default_model, smollm2_path  # noqa: E402

MODELS = {"gemma-3-270m": ensure_default_model, "smollm2-135m-instruct": smollm2_path}
KV_TYPES = ("q8_0", "f16")


def measure(model: str, kv_type: str, tokens: int, chunk: int) -> float:
    """Seconds to evaluate `tokens` prompt tokens (run in a child process: llama.cpp's kernel switches are the
    process's)."""
    from tokenrelay.backends.llamacpp.context import LlamaContext
    from tokenrelay.backends.llamacpp.model import LlamaModel
    from tokenrelay.config import EngineSettings

    loaded = LlamaModel(MODELS[model](shared_data_dir()))
    context = LlamaContext(loaded, EngineSettings(prefill_chunk=chunk), 1, tokens + chunk, kv_type=kv_type)
    text = " ".join(f"w{i} harbour" for i in range(tokens))
    prompt = loaded.tokenize(text, add_special=True, parse_special=False)[:tokens]
    started = time.perf_counter()
    for start in range(0, len(prompt), chunk):
        piece = prompt[start : start + chunk]
        context.run([(t, start + i, 0, start + i == len(prompt) - 1) for i, t in enumerate(piece)])
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tokens", type=int, default=4096)
    parser.add_argument("--chunk", type=int, default=512)
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("--one", nargs=2, metavar=("MODEL", "KV_TYPE"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(measure(args.one[0], args.one[1], args.tokens, args.chunk)))
        return
    seconds: dict[tuple[str, str], list[float]] = {}
    env = os.environ | {"GGML_CPU_TILED_MM": "0"}
    for trial in range(args.trials):
        for model in MODELS:
            for kv_type in KV_TYPES if trial % 2 == 0 else KV_TYPES[::-1]:
                command = [sys.executable, __file__, "--one", model, kv_type, "--tokens", str(args.tokens)]
                command += ["--chunk", str(args.chunk)]
                done = subprocess.run(command, capture_output=True, text=True, env=env, check=True)
                seconds.setdefault((model, kv_type), []).append(json.loads(done.stdout.strip().splitlines()[-1]))
    print(f"{args.tokens} prompt tokens in pieces of {args.chunk}, medians of {args.trials} (seconds)")
    for model in MODELS:
        q8, f16 = (statistics.median(seconds[model, kv_type]) for kv_type in KV_TYPES)
        print(f"{model:<24} q8_0 {q8:6.1f}   f16 {f16:6.1f}   f16 is {q8 / f16:.2f}x as fast")


if __name__ == "__main__":
    main()
