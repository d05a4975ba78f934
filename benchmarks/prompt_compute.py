"""A long prompt and the answer after it, without HTTP: tokenrelay's engine in process against llama-server's timings.

`long_prompts.py` times whole requests. This one takes the servers' front ends out, to show what the engines
themselves take on the same tokens. tokenrelay: its scheduler in process (default settings: a prompt past 1,024
tokens runs in the long slot), from a job's submission to its first token, then the time per token to its last.
llama-server (`-np 4 -c 32768 -t THREADS`, `cache_prompt: false`): the `timings.prompt_ms` and
`predicted_per_token_ms` it reports for the same token ids. Greedy, `--max-tokens` tokens, end of text banned. The
two take turns on each prompt, in alternating order, and a new salt each trial keeps any cache out; each ratio is
the median of the trials' ratios.

    python benchmarks/prompt_compute.py [--sizes 500 2000 6000] [--trials 5] [--max-tokens 64] [--llama-server PATH]
"""

from __future__ import annotations

import argparse
import os
import queue
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
for folder in (ROOT / "src", ROOT / "tests" / "support", ROOT / "benchmarks"):
    sys.path.insert(0, str(folder))

from servers import shared_data_dir  # noqa: E402

from engine import NO_EOS, Server, start_llama_server  # noqa: E402
from long_prompts import Prompts  # noqa: E402
from peer_build import llama_server_binary  # noqa: E402
from tokenrelay.backends.llamacpp.default_model import ensure_default_model  # noqa: E402
from tokenrelay.backends.llamacpp.kernels import invariant_switches  # noqa: E402

BANNED = {int(token): float(bias) for token, bias in NO_EOS.items()}  # the end-of-text tokens, as the engine takes them


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", type=int, nargs="+", default=[500, 2000, 6000], help="prompt tokens, roughly")
    parser.add_argument("--trials", type=int, default=5)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--llama-server", type=Path, default=None, help="a llama-server binary (default: build one)")
    parser.add_argument("--work-dir", type=Path, default=ROOT / ".bench-work")
    args = parser.parse_args()
    for name, value in invariant_switches().items():  # read by llama.cpp once, when the model loads
        os.environ.setdefault(name, value)
    from tokenrelay.backends.llamacpp.jobs import Job, JobDone, JobFailed, SeqPlan
    from tokenrelay.backends.llamacpp.sampling import SamplingParams
    from tokenrelay.backends.llamacpp.scheduler import Scheduler
    from tokenrelay.config import EngineSettings

    gguf = ensure_default_model(shared_data_dir())
    prompts = Prompts(gguf)
    scheduler = Scheduler(prompts.model, EngineSettings(threads=args.threads))
    scheduler.start()

    def ours(tokens: list[int]) -> Timing:
        events: queue.SimpleQueue[object] = queue.SimpleQueue()
        params = SamplingParams(temperature=0.0, logit_bias=BANNED)
        plan = SeqPlan(index=0, params=params, max_tokens=args.max_tokens, stops=[])
        started = time.perf_counter()
        scheduler.submit(Job(tokens, [plan], events.put))
        first = 0.0
        while not isinstance(event := events.get(timeout=900), JobDone | JobFailed):
            first = first or time.perf_counter()
        ended = time.perf_counter()
        if not isinstance(event, JobDone) or event.completion_tokens < 2:
            raise RuntimeError(f"the job ended with {event}")
        return Timing((first - started) * 1000, (ended - first) * 1000 / (event.completion_tokens - 1))

    def theirs(peer: Server, tokens: list[int]) -> Timing:
        body = {"prompt": tokens, "n_predict": args.max_tokens, "cache_prompt": False, "temperature": 0}
        body["logit_bias"] = [[token, False] for token in BANNED]
        timings = httpx.post(f"{peer.base}/completion", json=body, timeout=900).json()["timings"]
        return Timing(float(timings["prompt_ms"]), float(timings["predicted_per_token_ms"]))

    binary = args.llama_server or llama_server_binary(args.work_dir)
    with tempfile.TemporaryDirectory() as logs:
        peer = start_llama_server(binary, gguf, Path(logs), args, parallel=4, context=32768)
        try:
            times: dict[int, list[tuple[Timing, Timing]]] = {size: [] for size in args.sizes}
            for trial in range(args.trials):
                for size in args.sizes:
                    tokens = prompts.model.tokenize(
                        prompts.words(size, f"p{trial}s{size}"), add_special=True, parse_special=False
                    )
                    if trial % 2 == 0:
                        a, b = ours(tokens), theirs(peer, tokens)
                    else:
                        b, a = theirs(peer, tokens), ours(tokens)
                    times[size].append((a, b))
        finally:
            peer.process.terminate()
            peer.process.wait(timeout=30)
            scheduler.stop()
    print(f"\nmedians of {args.trials} alternating trials, in the engines: tokenrelay / llama-server")
    print("(ratio: the median of each trial's ratio, tokenrelay's time over llama-server's)")
    print(f"{'prompt tokens':>16}{'prompt ms':>20}{'ratio':>8}{'ms per token after it':>26}{'ratio':>8}")
    for size, pairs in times.items():
        cells = f"{'~' + format(size, ','):>16}"
        for part, width, digits in (("prompt_ms", 20, 0), ("token_ms", 26, 2)):
            a, b = (statistics.median(getattr(timing, part) for timing in side) for side in zip(*pairs, strict=True))
            ratio = statistics.median(getattr(x, part) / getattr(y, part) for x, y in pairs)
            cells += f"{f'{a:,.{digits}f} / {b:,.{digits}f}':>{width}}{ratio:>8.2f}"
        print(cells)


@dataclass
class Timing:
    prompt_ms: float  # to the first token
    token_ms: float  # per token after it


if __name__ == "__main__":
    main()
