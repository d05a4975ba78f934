"""Repacked weights only where a child process has decoded with them and lived; `/health` says which path runs."""

from __future__ import annotations

import sys
from pathlib import Path

import httpx
import pytest
from helpers import MODEL
from servers import Server, shared_data_dir, start_server

from tokenrelay.backends.llamacpp.cpu import invariance_key, keep_invariance, kept_invariance, repack_verdict
from tokenrelay.backends.llamacpp.default_model import ensure_default_model

SEGFAULT = [sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGSEGV)"]
SIGILL = [sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGILL)"]


def cpu(server: Server) -> dict:
    return httpx.get(f"{server.base_url}/health", timeout=10).json()["models"][MODEL]["cpu"]


def test_a_probe_killed_by_a_signal_means_no_repacking_and_the_verdict_is_kept(tmp_path: Path) -> None:
    gguf = ensure_default_model(shared_data_dir())
    verdict = repack_verdict(gguf, tmp_path, command=SEGFAULT)
    assert not verdict.safe and "SIGSEGV" in verdict.detail
    # Kept for this machine, build and model: a probe that would pass is not run again.
    again = repack_verdict(gguf, tmp_path, command=[sys.executable, "-c", "pass"])
    assert again == verdict
    assert not repack_verdict(gguf, None, command=SIGILL).safe
    assert repack_verdict(gguf, None, command=[sys.executable, "-c", "pass"]).safe


def test_health_reports_the_kernels_and_that_weights_are_not_repacked_by_default(server: Server) -> None:
    report = cpu(server)
    assert "AVX" in report["build_features"] or "NEON" in report["build_features"]
    assert report["repacked_weights"] is False
    assert report["repack_probe"].startswith("not run")


def test_repacking_asked_for_is_probed_and_the_server_serves_either_way(tmp_path_factory) -> None:
    """The real child loads the default model with repacking on and decodes. Where the CPU runs every kernel
    it advertises, it lives and the weights are repacked; where it faults, the server serves without."""
    data = tmp_path_factory.mktemp("repack-data")
    (data / "models").mkdir()
    gguf = ensure_default_model(shared_data_dir())
    args = ("--model", str(gguf), "--model-id", MODEL, "--slots", "2")
    env = {"TOKENRELAY_ENGINE__REPACK_WEIGHTS": "true"}
    srv = start_server(tmp_path_factory.mktemp("repack"), *args, env=env, data_dir=data)
    try:
        report = cpu(srv)
        assert report["repack_probe"] == "passed" or report["repack_probe"].startswith("failed: the probe died")
        assert report["repacked_weights"] is (report["repack_probe"] == "passed")
        assert list((data / "cpu-probes").glob("repack-*.json"))
        reply = srv.client().completions.create(model=MODEL, prompt="Hello", max_tokens=2, temperature=0)
        assert reply.usage.completion_tokens == 2
    finally:
        srv.stop()


def test_an_invariance_verdict_is_kept_per_setup_and_switch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF")
    probes = tmp_path / "probes"
    setup = {"slots": 20, "kv_type": "q8_0"}
    key = invariance_key(model, setup)
    assert kept_invariance(probes, key) is None
    keep_invariance(probes, key, invariant=True)
    assert kept_invariance(probes, key) is True
    assert kept_invariance(probes, invariance_key(model, setup | {"kv_type": "f16"})) is None
    monkeypatch.setenv("GGML_CPU_TILED_MM_FORCE", "1")
    assert kept_invariance(probes, invariance_key(model, setup)) is None  # another kernel choice: measured again
    assert kept_invariance(None, key) is None
