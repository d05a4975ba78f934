"""Which CPU kernels the embedded engine runs, and whether repacked weights are safe on this machine.

llama-cpp-python compiles llama.cpp with `-march=native`. On a CPU that advertises AMX, such a build moves
weights into the AMX buffer type whenever repacking ("extra buffer types") is on, and some virtual machines
advertise AMX (and grant its permission) yet fault on the first tile instruction: the process dies with
SIGILL or SIGSEGV on its first decode. With repacking off, llama.cpp never reaches the AMX kernels, and the
rest of the native build (AVX2, AVX512, VNNI) runs on such machines. So repacking stays off by default, and
a configuration that turns it on gets it only after a child process has decoded with it once and lived;
the verdict is kept per machine, build and model file.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import signal
import subprocess
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

import llama_cpp

log = logging.getLogger(__name__)

PROBE_TIMEOUT = 300.0  # loading and decoding a few tokens; a hung child counts as a failure
ADVERTISED = ("amx_tile", "amx_int8", "amx_bf16", "avx512_bf16", "avx512_fp16", "avx512_vnni", "avx512f", "avx2")


@dataclass(frozen=True)
class RepackVerdict:
    """Whether weights may be repacked here, and how that was decided."""

    safe: bool
    detail: str


def cpu_flags() -> set[str]:
    """The instruction families the CPU advertises (Linux; empty elsewhere)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return set()
    for line in text.splitlines():
        if line.startswith("flags"):
            return set(line.partition(":")[2].split())
    return set()


def build_features() -> str:
    """llama.cpp's own list of the CPU features it was built with and found (`AVX2 = 1 | ...`)."""
    return llama_cpp.llama_print_system_info().decode("utf-8", errors="replace").strip()


def cpu_report(repacked: bool, verdict: RepackVerdict | None) -> dict[str, object]:
    """What `/health` says about the kernels: the build's features, what the CPU advertises, repacking."""
    flags = cpu_flags()
    return {
        "build_features": build_features(),
        "advertised": sorted(flag for flag in ADVERTISED if flag in flags),
        "repacked_weights": repacked,
        "repack_probe": verdict.detail if verdict is not None else "not run (repack_weights is off)",
    }


def _probe_key(model_path: Path) -> str:
    library = Path(llama_cpp.__file__).parent / "lib"
    libraries = sorted(f"{p.name}:{p.stat().st_size}" for p in library.glob("*.so*")) if library.is_dir() else []
    stat = model_path.stat()
    parts = [" ".join(sorted(cpu_flags())), llama_cpp.__version__, *libraries, f"{model_path.name}:{stat.st_size}"]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16]


KERNEL_SWITCHES = ("GGML_", "LLAMA_ATTN_ROT_")  # environment switches that change what llama.cpp computes


def invariance_key(model_path: Path, setup: dict[str, object]) -> str:
    """What the batch-invariance probe's verdict depends on: the machine, the build, the model and `setup` (the
    kernel switches, the KV type, repacking, the probe's width and prompt pieces)."""
    switches = {name: os.environ.get(name) for name in sorted(os.environ) if name.startswith(KERNEL_SWITCHES)}
    described = json.dumps({"setup": setup, "switches": switches}, sort_keys=True)
    return hashlib.sha256(f"{_probe_key(model_path)}\n{described}".encode()).hexdigest()[:16]


def kept_invariance(cache_dir: Path | None, key: str) -> bool | None:
    """The verdict kept for `key` (None: never measured here)."""
    if cache_dir is None or not (cache_dir / f"invariance-{key}.json").exists():
        return None
    return bool(json.loads((cache_dir / f"invariance-{key}.json").read_text())["invariant"])


def keep_invariance(cache_dir: Path | None, key: str, *, invariant: bool) -> None:
    if cache_dir is not None:
        cache_dir.mkdir(parents=True, exist_ok=True)
        (cache_dir / f"invariance-{key}.json").write_text(json.dumps({"invariant": invariant}))


def repack_verdict(model_path: Path, cache_dir: Path | None, command: list[str] | None = None) -> RepackVerdict:
    """Decode with repacked weights once in a child process, or reuse the verdict kept in `cache_dir` for
    this machine, build and model; `command` replaces the child (tests of the verdict itself)."""
    cached = cache_dir / f"repack-{_probe_key(model_path)}.json" if cache_dir is not None else None
    if cached is not None and cached.exists():
        return RepackVerdict(**json.loads(cached.read_text()))
    child = [sys.executable, "-m", "tokenrelay.backends.llamacpp.repack_probe", str(model_path)]
    verdict = _run_probe(command or child)
    if cached is not None:
        cached.parent.mkdir(parents=True, exist_ok=True)
        cached.write_text(json.dumps(asdict(verdict)))
    return verdict


def _run_probe(command: list[str]) -> RepackVerdict:
    log.info("checking that repacked weights run on this CPU (a child process decodes once)")
    try:
        done = subprocess.run(command, capture_output=True, timeout=PROBE_TIMEOUT, check=False)
    except subprocess.TimeoutExpired:
        return RepackVerdict(False, f"failed: the probe did not finish in {PROBE_TIMEOUT:.0f} s")
    if done.returncode == 0:
        return RepackVerdict(True, "passed")
    if done.returncode < 0:
        name = signal.Signals(-done.returncode).name
        return RepackVerdict(False, f"failed: the probe died with {name} (the CPU faults on a repacked kernel)")
    tail = done.stderr.decode("utf-8", errors="replace").strip().splitlines()[-1:] or [""]
    return RepackVerdict(False, f"failed: the probe exited with status {done.returncode} ({tail[0][:200]})")
