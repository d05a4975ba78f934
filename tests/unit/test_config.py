"""Settings layering: YAML file < TOKENRELAY_* environment < command-line flags."""

from __future__ import annotations

import os
import subprocess
import sys
from decimal import Decimal
from pathlib import Path

import pytest

from tokenrelay.cli.main import build_parser, overrides_from
from tokenrelay.config import DEFAULT_MODEL_IDS, Pricing, load_settings


def test_file_then_env_then_flags(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = tmp_path / "c.yaml"
    config.write_text(
        "port: 9000\nhost: 127.0.0.2\nengine:\n  slots: 3\nmodels:\n  - id: a\n    path: ${MODEL_DIR}/a.gguf\n"
    )
    monkeypatch.setenv("MODEL_DIR", "/models")
    monkeypatch.setenv("TOKENRELAY_PORT", "9100")
    base = load_settings(config)
    assert (base.port, base.host, base.engine.slots) == (9100, "127.0.0.2", 3)
    assert base.models[0].path == Path("/models/a.gguf")
    flags = ["serve", "--port", "9200", "--slots", "5", "--model", "b.gguf", "--model-id", "b"]
    args = build_parser().parse_args(flags)
    settings = load_settings(config, overrides_from(args, base))
    assert (settings.port, settings.engine.slots) == (9200, 5)
    assert [m.id for m in settings.served_models()] == ["a", "b"]


def test_default_model_when_none_configured() -> None:
    assert [m.id for m in load_settings(None).served_models()] == list(DEFAULT_MODEL_IDS)


def test_model_id_must_follow_a_model() -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "--model-id", "x"])


def test_workers_receive_the_resolved_settings_secrets_included(monkeypatch: pytest.MonkeyPatch) -> None:
    from tokenrelay.server.workers.handover import ENV, settings_from_env, settings_json

    node = {"url": "http://10.0.0.5:8000/v1", "api_key": "sk-node"}
    resolved = load_settings(None, {"admin_key": "adm", "workers": 3, "models": [{"id": "big", "upstreams": [node]}]})
    monkeypatch.setenv(ENV, settings_json(resolved))
    monkeypatch.setenv("TOKENRELAY_PORT", "9999")  # the worker's environment does not layer over them again
    received = settings_from_env()
    assert received.model_dump() == resolved.model_dump() and received.port == 8000 and ENV not in os.environ
    assert received.models[0].upstreams[0].api_key.get_secret_value() == "sk-node"


def test_several_workers_need_upstream_only_models(tmp_path: Path) -> None:
    from tokenrelay.server.workers.supervisor import EmbeddedModelsWithWorkers, check_upstream_only

    node = {"url": "http://10.0.0.5:8000/v1"}
    upstream_only = {"id": "big", "upstreams": [node]}
    check_upstream_only(load_settings(None, {"workers": 2, "models": [upstream_only]}))
    mixed = {"id": "mixed", "path": str(tmp_path / "m.gguf"), "upstreams": [node]}
    with pytest.raises(EmbeddedModelsWithWorkers, match=r"but mixed runs on the embedded llama\.cpp engine"):
        check_upstream_only(load_settings(None, {"workers": 2, "models": [upstream_only, mixed]}))


@pytest.mark.parametrize("amount", [1.31939827197333e-189, 2.5e-7, 1e8, "0.000001", 0.15])
def test_a_price_written_back_reads_back_as_the_same_amount(amount: float | str) -> None:
    """A node registration's settings are stored as JSON and validated again at every load."""
    pricing = Pricing.model_validate({"input": amount, "output": amount, "cached_input": amount})
    again = Pricing.model_validate_json(pricing.model_dump_json())
    assert again == pricing and again.input == Decimal(str(amount))


def test_the_engine_threads_default_to_the_cpus_the_process_may_use() -> None:
    """Pinned to one CPU (`taskset`, a container's cpuset) the engine runs one thread, whatever the machine has."""
    read = ["-c", "from tokenrelay.config import EngineSettings; print(EngineSettings().threads)"]
    pinned = subprocess.run(["taskset", "-c", "0", sys.executable, *read], capture_output=True, text=True, check=True)
    free = subprocess.run([sys.executable, *read], capture_output=True, text=True, check=True)
    assert int(pinned.stdout) == 1
    assert int(free.stdout) == min(len(os.sched_getaffinity(0)), 8)
