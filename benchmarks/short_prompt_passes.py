"""A short slot's prompt by K cache precision and by how it is cut, in process: the choices behind `Lane.block` and
`Lane.unit`.

A prompt evaluated as one prompt pass (the tiled kernels throughout, as the server evaluates a prompt of 64 tokens or
more), or its whole blocks of 64 positions as a prompt pass and then its tail as a decoding pass (the row-by-row
kernels); over an F16 K cache (the default, whose attention takes the tiled kernel for 64 rows or more) and a Q8_0
one. Then a decoding step of 16 sequences over each cache. One context of 20 slots of 1,024 cells (the server's
short slots), with the kernel switches the server sets; the ways take turns within each trial, medians of `--trials`.

    python benchmarks/short_prompt_passes.py [--tokens 500] [--trials 7]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "tests" / "support"))

from servers import shared_data_dir  # noqa: E402

from tokenrelay.backends.llamacpp.default_model import ensure_default_model  # noqa: E402
from tokenrelay.backends.llamacpp.kernels import invariant_switches  # noqa: E402

BLOCK = 64
CACHED = 300  # cells each decoding sequence holds


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tokens", type=int, default=500)
    parser.add_argument("--trials", type=int, default=7)
    args = parser.parse_args()
    for name, value in invariant_switches().items():  # read by llama.cpp once, when the model loads
        os.environ.setdefault(name, value)
    from tokenrelay.backends.llamacpp.context import LlamaContext
    from tokenrelay.backends.llamacpp.model import LlamaModel
    from tokenrelay.config import EngineSettings

    model = LlamaModel(ensure_default_model(shared_data_dir()))
    text = " ".join(f"item{i} river stone {i * 7 % 13}" for i in range(args.tokens))
    tokens = model.tokenize(text, add_special=True, parse_special=False)[: args.tokens]
    settings = EngineSettings()
    contexts = {kv: LlamaContext(model, settings, 20, 1024, kv_type=kv, v_type="f16") for kv in ("q8_0", "f16")}

    def rows(start: int, end: int) -> list[tuple[int, int, int, bool]]:
        return [(t, start + i, 0, start + i == len(tokens) - 1) for i, t in enumerate(tokens[start:end])]

    def one_pass(context: LlamaContext) -> None:
        context.run(rows(0, len(tokens)), prompt=True)

    def blocks_then_tail(context: LlamaContext) -> None:
        blocks = len(tokens) // BLOCK * BLOCK
        if blocks:
            context.run(rows(0, blocks), prompt=True)
        if blocks < len(tokens):
            context.run(rows(blocks, len(tokens)), prompt=False)

    ways: dict[str, tuple[LlamaContext, Callable[[LlamaContext], None]]] = {}
    for kv, context in contexts.items():
        ways[f"{kv} K, one prompt pass"] = (context, one_pass)
        ways[f"{kv} K, blocks then tail"] = (context, blocks_then_tail)
    times: dict[str, list[float]] = {name: [] for name in ways}
    for _ in range(args.trials):
        for name, (context, way) in ways.items():
            context.reset()
            started = time.perf_counter()
            way(context)
            times[name].append(time.perf_counter() - started)
    print(f"a prompt of {len(tokens)} tokens, medians of {args.trials}")
    for name, seconds in times.items():
        print(f"  {name:<28}{statistics.median(seconds) * 1000:>8,.0f} ms")
    steps: dict[str, list[float]] = {kv: [] for kv in contexts}
    for context in contexts.values():
        context.reset()
        for seq in range(16):
            context.run([(t, i, seq, False) for i, t in enumerate(tokens[:CACHED])], prompt=True)
    for trial in range(3):
        for kv, context in contexts.items():
            started = time.perf_counter()
            for k in range(20):
                position = CACHED + trial * 20 + k
                context.run([(tokens[k], position, seq, True) for seq in range(16)])
            steps[kv].append((time.perf_counter() - started) / 20)
    print(f"a decoding step of 16 sequences at ~{CACHED} cells, medians of 3 runs of 20")
    for kv, seconds in steps.items():
        print(f"  {kv} K{statistics.median(seconds) * 1000:>10.1f} ms")
    for context in contexts.values():
        context.close()
    model.close()


if __name__ == "__main__":
    main()
