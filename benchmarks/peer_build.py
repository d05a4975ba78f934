"""llama.cpp's `llama-server`, built from the sdist of the installed llama-cpp-python: the peer of the engine
benchmark runs the very llama.cpp that tokenrelay embeds.

The build is cmake's default for the machine (native), server target only, kept under the work dir and reused.

    python benchmarks/peer_build.py [--work-dir .bench-work]    # prints the binary's path
"""

from __future__ import annotations

import argparse
import importlib.metadata
import os
import subprocess
import sys
import tarfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def llama_server_binary(work_dir: Path) -> Path:
    version = importlib.metadata.version("llama-cpp-python")
    build = work_dir / f"llama-server-{version}"
    binary = build / "bin" / "llama-server"
    if binary.exists():
        return binary
    source = _vendored_source(work_dir, version)
    print(f"building llama-server {version} from {source} (several minutes, once)", flush=True)
    configure = ["cmake", "-S", str(source), "-B", str(build), "-DCMAKE_BUILD_TYPE=Release", "-DLLAMA_CURL=OFF"]
    configure += ["-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_EXAMPLES=OFF", "-DLLAMA_BUILD_SERVER=ON"]
    subprocess.run(configure, check=True, stdout=subprocess.DEVNULL)
    jobs = str(os.cpu_count() or 2)
    subprocess.run(["cmake", "--build", str(build), "--target", "llama-server", "-j", jobs], check=True)
    return binary


def _vendored_source(work_dir: Path, version: str) -> Path:
    """llama.cpp as vendored in llama-cpp-python's sdist, downloaded from the package index once."""
    unpacked = work_dir / f"llama_cpp_python-{version}"
    if not unpacked.exists():
        work_dir.mkdir(parents=True, exist_ok=True)
        spec = f"llama-cpp-python=={version}"
        pip = [sys.executable, "-m", "pip", "download", spec, "--no-deps", "--no-binary", ":all:", "-d", str(work_dir)]
        subprocess.run(pip, check=True)
        with tarfile.open(work_dir / f"llama_cpp_python-{version}.tar.gz") as archive:
            archive.extractall(work_dir, filter="data")
    return unpacked / "vendor" / "llama.cpp"


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--work-dir", type=Path, default=ROOT / ".bench-work")
    print(llama_server_binary(parser.parse_args().work_dir))
