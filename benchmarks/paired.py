"""Before and after, side by side: tokenrelay from several source trees, each relaying to one mock node.

Run from a checkout: `python benchmarks/paired.py before=/tmp/old/src after=src` (needs `wrk`, like
`gateway.py`, whose helpers it uses). Each `name=path` is a tokenrelay `src` directory, e.g. a `git worktree`
of an older commit; `name=path,VAR=value` also sets environment variables for that one. All of them start
against the same mock node, and are then loaded with wrk in alternating order, round after round (so a noisy
machine affects them alike). For each it prints requests/s, the p50 latency, its CPU time per request and the mock
node's CPU time per request (what the node spends on what tokenrelay sends it), with medians at the end; `--direct`
adds the mock node loaded directly, for the ratio the issue's target is set in.
Not part of the test run: figures depend on the machine and on whatever else it is doing.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from contextlib import ExitStack
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import gateway  # a sibling script, found through the path above


def start(stack: ExitStack, work: Path, node: gateway.Target, variant: str, workers: int) -> gateway.Target:
    """A tokenrelay serving `variant` (`name=src[,VAR=value...]`) with the mock node as its one upstream."""
    name, _, rest = variant.partition("=")
    src, *assignments = rest.split(",")
    env = {"PYTHONPATH": str(Path(src).resolve()), **dict(a.split("=", 1) for a in assignments)}
    return gateway.start_tokenrelay(stack, work, node, None, None, workers, name=name, env=env)


Figures = tuple[float, float, float, float]  # requests/s, p50 ms, CPU us per request, the node's CPU us per request


def measure(
    target: gateway.Target, node: gateway.Target, stream: bool, args: argparse.Namespace, work: Path
) -> Figures:
    result = gateway.run_wrk(target, stream, args.connections, args.seconds, work, node_pid=node.pid)
    return result.rps, result.p50_ms, result.cpu_us or 0.0, result.node_cpu_us or 0.0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("variants", nargs="+", help="name=path/to/src[,VAR=value...]")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=int, default=5, help="length of each measured wrk run")
    parser.add_argument("--workers", type=int, default=2, help="tokenrelay's --workers for every variant")
    parser.add_argument("--connections", type=int, default=64)
    parser.add_argument("--modes", default="json,stream", help="json, stream or both, comma-separated")
    parser.add_argument("--direct", action="store_true", help="also load the mock node directly")
    args = parser.parse_args()
    results: dict[tuple[str, str], list[Figures]] = {}
    with ExitStack() as stack:
        work = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="tokenrelay-paired-")))
        node = gateway.start_mock(stack, work)
        targets = [start(stack, work, node, variant, args.workers) for variant in args.variants]
        for number in range(args.rounds):
            order = targets if number % 2 == 0 else targets[::-1]
            for mode in args.modes.split(","):
                for target in ([node] if args.direct else []) + order:
                    figures = measure(target, node, mode == "stream", args, work)
                    results.setdefault((target.name, mode), []).append(figures)
                    print(f"round {number} {mode:<6} {target.name:<12} {_cells(figures)}", flush=True)
    print(f"\nmedians of {args.rounds} rounds, concurrency {args.connections}, tokenrelay --workers {args.workers}")
    for (name, mode), runs in sorted(results.items(), key=lambda item: (item[0][1], item[0][0])):
        medians = tuple(statistics.median(run[i] for run in runs) for i in range(4))
        print(f"{mode:<6} {name:<12} {_cells(medians)}")  # type: ignore[arg-type]
    return 0


def _cells(figures: Figures) -> str:
    rps, p50_ms, cpu_us, node_us = figures
    return f"{rps:9.0f} req/s  p50 {p50_ms:6.2f} ms  cpu {cpu_us:6.1f} us/req  node {node_us:5.1f} us/req"


if __name__ == "__main__":
    raise SystemExit(main())
