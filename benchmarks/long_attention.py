"""A long slot's attention: flash attention against plain matrix products, on SmolLM2's small heads.

llama.cpp's CPU flash attention visits the cache key by key for every head; SmolLM2-135M has 9 heads of 64
dimensions in 30 layers and no sliding window, so after a long prompt each decoding step pays that per key. Two
`tokenrelay serve` processes take turns trial by trial, one with `long_flash_attention: auto` (off for heads under
128 dimensions) and one with `on`, each sent a greedy completion of `--max-tokens` tokens (end of text banned)
after a prompt of about `--prompt-tokens` tokens that repeats no run of words. Medians of `--trials`.

    python benchmarks/long_attention.py [--trials 3] [--prompt-tokens 6000] [--max-tokens 64]
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

from servers import free_port  # noqa: E402

from engine import Server, one, rss_mib, start  # noqa: E402
from long_prompts import Prompts, decode_tok_s  # noqa: E402
from tokenrelay.backends.llamacpp.default_model import smollm2_path  # noqa: E402

MODEL = "smollm2-135m-instruct"
NO_EOS = {"0": -100, "2": -100}  # SmolLM2's end-of-text and end-of-turn tokens
MODES = ("auto", "on")


def serve(mode: str, gguf: Path, work: Path, threads: int) -> Server:
    config = work / f"{mode}.yaml"
    config.write_text(f"engine:\n  long_flash_attention: '{mode}'\n")
    port = free_port()
    command = [sys.executable, "-m", "tokenrelay", "serve", "--port", str(port), "--data-dir", str(work / mode)]
    command += ["--config", str(config), "--model", str(gguf), "--model-id", MODEL, "--threads", str(threads)]
    return start(mode, command, work)


def timed(server: Server, prompt: str, max_tokens: int) -> tuple[float, float]:
    """Time to the first token (s) and decoding speed after it (tokens/s)."""
    body = {"model": MODEL, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "logit_bias": NO_EOS}

    async def run() -> tuple[float, float]:
        async with httpx.AsyncClient(base_url=server.base, timeout=1800) as client:
            stream = await one(client, body)
        return stream[1], decode_tok_s(stream)

    return asyncio.run(run())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("--prompt-tokens", type=int, default=6000)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    gguf = smollm2_path(Path())
    prompts = Prompts(gguf)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        servers = [serve(mode, gguf, work, args.threads) for mode in MODES]
        figures: dict[str, list[tuple[float, float]]] = {mode: [] for mode in MODES}
        try:
            for trial in range(args.trials):
                for server in servers:
                    prompt = prompts.words(args.prompt_tokens, f"t{trial}{server.name}")
                    figures[server.name].append(timed(server, prompt, args.max_tokens))
                    ttft, tok_s = figures[server.name][-1]
                    print(f"trial {trial} {server.name:>4}: TTFT {ttft:6.1f} s, decode {tok_s:5.1f} tok/s", flush=True)
            print(f"\nmedians, ~{args.prompt_tokens} prompt tokens, {args.max_tokens} generated:")
            for server in servers:
                ttft = statistics.median(t for t, _ in figures[server.name])
                tok_s = statistics.median(s for _, s in figures[server.name])
                rss = rss_mib(server.process.pid)
                figure = f"TTFT {ttft:6.1f} s, {tok_s:5.1f} tok/s, RSS {rss:,.0f} MiB"
                print(f"  long_flash_attention {server.name:>4}: {figure}")
        finally:
            for server in servers:
                server.process.terminate()
                server.process.wait(timeout=30)


if __name__ == "__main__":
    main()
