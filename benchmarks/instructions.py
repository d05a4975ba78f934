"""Instructions per relayed request, counted by valgrind: a before/after figure that machine noise does not move.

Run from a checkout: `python benchmarks/instructions.py before=/tmp/old/src after=src` (needs `valgrind`). For
each `name=path` (a tokenrelay `src` directory, e.g. a `git worktree` of an older commit) it runs one cell of
`benchmarks/breakdown.py` (the app driven in-process; by default `canned, no observers`, streamed) under
callgrind twice, with `--small` and `--large` measured requests after the same warm-up, and prints the
difference of the two instruction totals per extra request: start-up and warm-up cancel out.

Why: on the shared 2-core machines these figures come from, two runs of the same code under wrk differ by up
to 15%, more than most single changes are worth. Instructions are not time (cache misses and system calls are
not in them), but the counts of one tree repeat to within about 1% (`STEADY` below lists what would otherwise
move them), so a change that removes work shows; `--repeat` shows how steady they are.
`canned, no observers` keeps sockets, timers and the ledger's thread out of the count, which is what makes it
repeat; `--setup full` counts the node exchange too, less steadily. Each run takes about two minutes. Not part
of the test run.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
# What would make the two runs differ by more than their requests: start-up's dicts and sets are hashed with a
# seed of their own in each run unless it is fixed; OpenBLAS (loaded with numpy) starts a thread per core that
# spins while it waits for work, for as many instructions as the scheduler lets it; and the server's timers (the
# batch runner's poll, the registrations' reload, node probes, key cache expiry) fire by the clock, and a run
# under valgrind lasts minutes. Settings an older tree does not have are ignored by it.
STEADY = {
    "PYTHONHASHSEED": "0",
    "OPENBLAS_NUM_THREADS": "1",
    "TOKENRELAY_BATCHES__POLL_SECONDS": "100000",
    "TOKENRELAY_ROUTING__REGISTRY_SYNC_SECONDS": "100000",
    "TOKENRELAY_ROUTING__HEALTH__PROBE_INTERVAL": "0",
    "TOKENRELAY_ACCOUNTING__KEY_CACHE_SECONDS": "100000",
}


def instructions(src: Path, setup: str, mode: str, requests: int, work: Path) -> int:
    """Every instruction of one breakdown run (callgrind's total; children such as the mock node not traced)."""
    out = work / f"callgrind-{requests}.out"
    command = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", sys.executable]
    command += [str(HERE / "breakdown.py"), "--src", str(src), "--setup", setup, "--modes", mode]
    command += ["--requests", str(requests)]
    subprocess.run(command, check=True, capture_output=True, env=os.environ | STEADY)
    totals = re.search(r"^(?:summary|totals): (\d+)", out.read_text(), re.MULTILINE)
    if totals is None:
        raise RuntimeError(f"no instruction total in {out}")
    return int(totals.group(1))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("variants", nargs="+", help="name=path/to/src")
    parser.add_argument("--setup", default="canned, no observers", help="a set-up of benchmarks/breakdown.py")
    parser.add_argument("--mode", default="stream", choices=["json", "stream"])
    parser.add_argument("--small", type=int, default=300, help="measured requests in the first run")
    parser.add_argument("--large", type=int, default=1300, help="measured requests in the second run")
    parser.add_argument("--repeat", type=int, default=1, help="measure every variant this many times, in turn")
    args = parser.parse_args()
    variants = [(name, Path(path).resolve()) for name, _, path in (v.partition("=") for v in args.variants)]
    print(f"instructions per {args.mode} request, '{args.setup}', ({args.large} - {args.small} requests)")
    with tempfile.TemporaryDirectory(prefix="tokenrelay-instructions-") as work:
        for _ in range(args.repeat):
            for name, src in variants:
                small = instructions(src, args.setup, args.mode, args.small, Path(work))
                large = instructions(src, args.setup, args.mode, args.large, Path(work))
                print(f"{name:<12} {(large - small) / (args.large - args.small):12,.0f}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
