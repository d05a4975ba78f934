"""Long prompts on the embedded engine: tokenrelay vs llama.cpp's own `llama-server`, same Gemma GGUF.

What an agent session costs: the time to the first token of a long prompt, the decoding speed after it, the
second turn of a conversation (the history resent with a few new words), and how streams that are decoding fare
while a long prompt arrives. One request at a time, the servers back to back on each prompt in alternating order;
each ratio is the median of the trials' ratios, the timings medians of `--trials`.

- tokenrelay: `tokenrelay serve` with its defaults (a long slot with the model's context beside the short slots).
- llama-server: built from the sdist of the installed llama-cpp-python, `-np 4 -c 32768 -t THREADS` (the same
  context for a request), its defaults otherwise.

With `--fast`, a third server takes part in the prompt-size trials: `tokenrelay serve` with `batch_invariant: false`
and `repack_weights: true` (llama-server's kernels: chosen by batch shape, weights repacked), which shows what batch
invariance costs. Its turns and streams are not measured.

Both are sent greedy requests (temperature 0: no sampler chain to tell apart) with the end-of-text tokens banned,
so every answer is `--max-tokens` long.

    python benchmarks/long_prompts.py [--trials 3] [--max-tokens 64] [--sizes 500 2000 6000] [--llama-server PATH]
        [--fast]
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

from engine import MODEL, NO_EOS, Server, Stream, one, rss_mib, start, start_llama_server  # noqa: E402
from peer_build import llama_server_binary  # noqa: E402
from tokenrelay.backends.llamacpp.default_model import ensure_default_model  # noqa: E402
from tokenrelay.backends.llamacpp.model import LlamaModel  # noqa: E402

SIZES = (500, 2000, 6000)  # prompt tokens, roughly
WORDS = [
    "harbour",
    "ledger",
    "lantern",
    "copper",
    "meadow",
    "violin",
    "granite",
    "orchard",
    "saddle",
    "thistle",
    "compass",
    "velvet",
]
FAST = "tokenrelay-fast"  # without batch invariance, weights repacked (--fast)
TURN_SIZE = 6000
NEW_TOKENS = 50  # what turn 2 adds
STREAMS = 3  # llama-server runs 4 slots: one stays free for the long prompt


class Prompts:
    """Texts of about N of the model's tokens that repeat no run of words; a salt keeps them apart (no shared
    cache between trials)."""

    def __init__(self, gguf: Path) -> None:
        self.model = LlamaModel(gguf)

    def count(self, text: str) -> int:
        return len(self.model.tokenize(text, add_special=True, parse_special=False))

    def words(self, tokens: int, salt: str) -> str:
        text = self._text(tokens // 4, salt)
        return self._text(round(tokens // 4 * tokens / self.count(text)), salt)

    @staticmethod
    def _text(pairs: int, salt: str) -> str:
        return " ".join(f"{salt}{i} {WORDS[i * 7 % len(WORDS)]}" for i in range(pairs))


def request(prompt: str, max_tokens: int) -> dict[str, object]:
    return {"model": MODEL, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "logit_bias": NO_EOS}


def timed(server: Server, prompt: str, max_tokens: int) -> Stream:
    async def run() -> Stream:
        async with httpx.AsyncClient(base_url=server.base, timeout=900) as client:
            return await one(client, request(prompt, max_tokens))

    return asyncio.run(run())


def decode_tok_s(stream: Stream) -> float:
    tokens, _, _, gaps = stream
    return (tokens - 1) / sum(gaps) if gaps else float("nan")


async def streams_during_a_long_prompt(server: Server, long_prompt: str, salt: str, max_tokens: int) -> list[float]:
    """Inter-token gaps (s) of STREAMS streams decoding while a TURN_SIZE-token prompt arrives beside them."""
    async with httpx.AsyncClient(base_url=server.base, timeout=900) as client:
        decoding = [
            asyncio.create_task(one(client, request(f"Story {i} {salt}: once upon a time", 4 * max_tokens)))
            for i in range(STREAMS)
        ]
        await asyncio.sleep(2.0)  # the streams are decoding
        long = asyncio.create_task(one(client, request(long_prompt, 8)))
        done = await asyncio.gather(*decoding)
        await long
    return [gap for _, _, _, gaps in done for gap in gaps]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--llama-server", type=Path, default=None, help="a llama-server binary (default: build one)")
    parser.add_argument("--work-dir", type=Path, default=ROOT / ".bench-work")
    parser.add_argument("--sizes", type=int, nargs="+", default=list(SIZES), help="prompt sizes (tokens, roughly)")
    parser.add_argument("--fast", action="store_true", help="also tokenrelay without batch invariance, repacked")
    args = parser.parse_args()
    gguf = ensure_default_model(shared_data_dir())
    binary = args.llama_server or llama_server_binary(args.work_dir)
    with tempfile.TemporaryDirectory() as tmp:
        logs = Path(tmp)

        def serve(data_dir: Path) -> list[str]:
            command = [sys.executable, "-m", "tokenrelay", "serve", "--port", str(free_port())]
            command += ["--data-dir", str(data_dir), "--model", str(gguf), "--model-id", MODEL]
            return [*command, "--threads", str(args.threads)]

        servers = [start("tokenrelay", serve(logs), logs)]
        if args.fast:
            variant = {"TOKENRELAY_ENGINE__BATCH_INVARIANT": "false", "TOKENRELAY_ENGINE__REPACK_WEIGHTS": "true"}
            servers.append(start(FAST, serve(logs / "fast"), logs, env=variant))
        peer = start_llama_server(binary, gguf, logs, args, parallel=4, context=32768)
        servers.append(peer)
        try:
            measure(servers, Prompts(gguf), args)
        finally:
            for server in servers:
                server.process.terminate()
                server.process.wait(timeout=30)


def measure(servers: list[Server], prompts: Prompts, args: argparse.Namespace) -> None:
    ttft: dict[tuple[str, int], list[float]] = {}
    speed: dict[tuple[str, int], list[float]] = {}
    turns: dict[str, list[float]] = {}
    gaps: dict[str, list[float]] = {}
    for trial in range(args.trials):
        order = servers if trial % 2 == 0 else servers[::-1]
        # The servers back to back on each prompt, so that a trial's ratio compares moments of one machine state.
        for size in args.sizes:
            for server in order:
                stream = timed(server, prompts.words(size, f"t{trial}s{size}"), args.max_tokens)
                ttft.setdefault((server.name, size), []).append(stream[1])
                speed.setdefault((server.name, size), []).append(decode_tok_s(stream))
        for server in order:
            if server.name == FAST:
                continue
            history = prompts.words(TURN_SIZE, f"turn{trial}")
            first = timed(server, history, args.max_tokens)
            second = timed(server, history + first[2] + " " + prompts.words(NEW_TOKENS, "next"), args.max_tokens)
            turns.setdefault(server.name, []).append(second[1] / first[1])
            long = prompts.words(TURN_SIZE, f"c{trial}")
            gaps.setdefault(server.name, []).extend(
                asyncio.run(streams_during_a_long_prompt(server, long, f"c{trial}", 64))
            )
            server.rss = max(server.rss, rss_mib(server.process.pid))
    report(servers, ttft, speed, turns, gaps, args)


def median(values: list[float]) -> float:
    return statistics.median(values)


def report(
    servers: list[Server],
    ttft: dict[tuple[str, int], list[float]],
    speed: dict[tuple[str, int], list[float]],
    turns: dict[str, list[float]],
    gaps: dict[str, list[float]],
    args: argparse.Namespace,
) -> None:
    peer = servers[-1].name
    for ours in (server.name for server in servers[:-1]):
        print(f"\nmedians of {args.trials} alternating trials, greedy, {args.max_tokens} tokens; {ours} vs {peer}")
        print("(ratio: the median of each trial's ratio, the two servers back to back on one prompt)")
        print(f"{'prompt tokens':>16}{'TTFT ms':>18}{'ratio':>8}{'decode tok/s':>22}{'ratio':>8}")
        for size in args.sizes:
            a, b = median(ttft[ours, size]) * 1000, median(ttft[peer, size]) * 1000
            sa, sb = median(speed[ours, size]), median(speed[peer, size])
            ratio = median([x / y for x, y in zip(ttft[ours, size], ttft[peer, size], strict=True)])
            faster = median([x / y for x, y in zip(speed[ours, size], speed[peer, size], strict=True)])
            cells = f"{'~' + format(size, ','):>16}{a:>9,.0f} /{b:>7,.0f}{ratio:>8.2f}{sa:>11.1f} /{sb:>8.1f}"
            print(f"{cells}{faster:>8.2f}  {verdict(ratio <= 1.0 and faster >= 1.0)}")
    servers = [server for server in servers if server.name != FAST]
    for server in servers:
        share = median(turns[server.name])
        print(f"{server.name}: turn 2 of a {TURN_SIZE:,}-token conversation, TTFT {share:.0%} of turn 1's", end="")
        print(f"  {verdict(share <= 0.10)}")
    for server in servers:
        p50, p99 = quantile(gaps[server.name], 0.5), quantile(gaps[server.name], 0.99)
        print(f"{server.name}: {STREAMS} streams while a {TURN_SIZE:,}-token prompt arrives, inter-token", end="")
        print(f" p50 {p50 * 1000:.0f} ms, p99 {p99 * 1000:.0f} ms ({p99 / p50:.1f}x)  {verdict(p99 <= 2 * p50)}")
    print(f"RSS MiB after the trials: {', '.join(f'{s.name} {s.rss:,.0f}' for s in servers)}")


def quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def verdict(met: bool) -> str:
    return "met" if met else "NOT MET"


if __name__ == "__main__":
    main()
