"""A long slot's attention: flash attention against plain matrix products (SmolLM2's small heads, Gemma's large).

llama.cpp's CPU flash attention visits the cache key by key for every head; SmolLM2-135M has 9 heads of 64
dimensions in 30 layers and no sliding window, so after a long prompt each decoding step pays that per key. Two
`tokenrelay serve` processes take turns trial by trial, one with `long_flash_attention: auto` (off for heads under
128 dimensions) and one with `on`, each sent a greedy completion of `--max-tokens` tokens (end of text banned)
after a prompt of about `--prompt-tokens` tokens that repeats no run of words. Medians of `--trials`. With
`--model gemma-3-270m` (4 heads of 256 dimensions) the two modes are `off` and `auto` (on) instead.

    python benchmarks/long_attention.py [--model smollm2-135m-instruct] [--trials 3] [--prompt-tokens 6000]

`--setting NAME --values A B` compares two values of another engine setting the same way, e.g. Gemma's long slot
with its sliding-window layers' window only and with every cell:

    python benchmarks/long_attention.py --model gemma-3-270m --setting long_window --values true false
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
for folder in (ROOT / "src", ROOT / "tests" / "support", ROOT / "benchmarks"):
    sys.path.insert(0, str(folder))

from servers import free_port, shared_data_dir  # noqa: E402

from engine import NO_EOS as GEMMA_NO_EOS  # noqa: E402
from engine import Server, one, rss_mib, start  # noqa: E402
from long_prompts import Prompts, decode_tok_s  # noqa: E402
from tokenrelay.backends.llamacpp.default_model import ensure_default_model, smollm2_path  # noqa: E402

# Per model: its end-of-text tokens (banned, so every answer is as long) and the setting `auto` is compared with.
MODELS = {
    "smollm2-135m-instruct": ({"0": -100, "2": -100}, "on"),
    "gemma-3-270m": (GEMMA_NO_EOS, "off"),
}


def serve(setting: str, mode: str, model: str, gguf: Path, work: Path, threads: int) -> Server:
    config = work / f"{mode}.yaml"
    config.write_text(f"engine:\n  {setting}: '{mode}'\n")
    port = free_port()
    command = [sys.executable, "-m", "tokenrelay", "serve", "--port", str(port), "--data-dir", str(work / mode)]
    command += ["--config", str(config), "--model", str(gguf), "--model-id", model, "--threads", str(threads)]
    return start(mode, command, work)


def timed(server: Server, model: str, prompt: str, max_tokens: int) -> tuple[float, float]:
    """Time to the first token (s) and decoding speed after it (tokens/s)."""
    no_eos, _ = MODELS[model]
    body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "logit_bias": no_eos}

    async def run() -> tuple[float, float]:
        async with httpx.AsyncClient(base_url=server.base, timeout=1800) as client:
            stream = await one(client, body)
        return stream[1], decode_tok_s(stream)

    return asyncio.run(run())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", choices=sorted(MODELS), default="smollm2-135m-instruct")
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("--prompt-tokens", type=int, default=6000)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--setting", default="long_flash_attention")
    parser.add_argument("--values", nargs=2, metavar=("A", "B"), help="default: auto and the model's other mode")
    args = parser.parse_args()
    gguf = smollm2_path(Path()) if args.model.startswith("smollm2") else ensure_default_model(shared_data_dir())
    prompts = Prompts(gguf)
    modes = tuple(args.values or ("auto", MODELS[args.model][1]))
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        servers = [serve(args.setting, mode, args.model, gguf, work, args.threads) for mode in modes]
        figures: dict[str, list[tuple[float, float]]] = {mode: [] for mode in modes}
        try:
            for trial in range(args.trials):
                for server in servers:
                    prompt = prompts.words(args.prompt_tokens, f"t{trial}{server.name}")
                    figures[server.name].append(timed(server, args.model, prompt, args.max_tokens))
                    ttft, tok_s = figures[server.name][-1]
                    print(f"trial {trial} {server.name:>5}: TTFT {ttft:6.1f} s, decode {tok_s:5.1f} tok/s", flush=True)
            print(f"\nmedians, ~{args.prompt_tokens} prompt tokens, {args.max_tokens} generated:")
            for server in servers:
                ttft = statistics.median(t for t, _ in figures[server.name])
                tok_s = statistics.median(s for _, s in figures[server.name])
                rss = rss_mib(server.process.pid)
                figure = f"TTFT {ttft:6.1f} s, {tok_s:5.1f} tok/s, RSS {rss:,.0f} MiB"
                print(f"  {args.setting} {server.name:>5}: {figure}")
        finally:
            for server in servers:
                server.process.terminate()
                server.process.wait(timeout=30)


if __name__ == "__main__":
    main()
