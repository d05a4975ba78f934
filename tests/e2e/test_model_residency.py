"""Three engine models, two loaded at most: requests for any of them are answered, idle models make room least
recently used first, a pinned model stays, `keep_alive: 0` unloads after the answer, memory goes back down, and
the operator loads and unloads by hand (HTTP and `tokenrelay models`)."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from accounting_support import sqlite_url
from batch_support import FAST, chat_line, submit, wait_ended
from gateway_support import wait_for
from servers import SRC, Server, server_env, shared_data_dir, start_server

from tokenrelay.backends.llamacpp.default_model import ensure_default_model, smollm2_path

ADMIN = "residency-admin-key-0123456789"
BASE, SMOL_A, SMOL_B = "gemma", "smol-a", "smol-b"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    tmp = tmp_path_factory.mktemp("residency")
    smol = str(smollm2_path(Path()))
    config = {
        "admin_key": ADMIN,
        "engine": {"slots": 2, "ctx_per_slot": 512, "long_slots": 0, "max_loaded_models": 2},
        "models": [
            {"id": BASE, "path": str(ensure_default_model(shared_data_dir())), "chat": False, "pin": True},
            {"id": SMOL_A, "path": smol},
            {"id": SMOL_B, "path": smol, "keep_alive": 0},
        ],
    }
    (tmp / "tokenrelay.yaml").write_text(yaml.safe_dump(config))
    server = start_server(tmp, "--config", str(tmp / "tokenrelay.yaml"), "--database-url", sqlite_url(tmp), env=FAST)
    try:
        yield server
    finally:
        server.stop()


def admin(server: Server) -> httpx.Client:
    return server.http(headers={"Authorization": f"Bearer {ADMIN}"})


def states(server: Server) -> dict[str, dict[str, Any]]:
    with admin(server) as http:
        return {model["id"]: model for model in http.get("/admin/models").json()["data"]}


def rss_bytes(server: Server) -> int:
    status = Path(f"/proc/{server.process.pid}/status").read_text()
    line = next(line for line in status.splitlines() if line.startswith("VmRSS:"))
    return int(line.split()[1]) * 1024


def ask(server: Server, model: str) -> str:
    client = server.client()
    if model == BASE:
        return client.completions.create(model=model, prompt="Once upon a time", max_tokens=4).choices[0].text
    answer = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "Say hi."}], max_tokens=4, temperature=0
    )
    return answer.choices[0].message.content or ""


def test_models_are_listed_with_their_state_before_any_request(server: Server) -> None:
    listed = {model.id: model.model_dump() for model in server.client().models.list().data}
    assert set(listed) == {BASE, SMOL_A, SMOL_B}
    assert [listed[m]["state"] for m in (BASE, SMOL_A, SMOL_B)] == ["loaded", "loaded", "unloaded"]
    assert listed[SMOL_B]["memory_bytes"] == 0 < listed[SMOL_B]["memory_estimate_bytes"]
    assert listed[SMOL_A]["memory_bytes"] > 98_000_000  # the GGUF's weights at least
    assert all(listed[m]["context_length"] == 512 for m in listed)


def test_alternating_requests_are_all_answered_within_two_loaded_models(server: Server) -> None:
    two_models = rss_bytes(server)
    ask(server, SMOL_A)  # SMOL_A's pages are touched once before the memory is compared
    two_models = max(two_models, rss_bytes(server))
    for _ in range(2):
        for model in (SMOL_B, SMOL_A, BASE):
            assert ask(server, model)
            loaded = [m for m, s in states(server).items() if s["state"] != "unloaded"]
            assert len(loaded) <= 2 and BASE in loaded
    # SMOL_B unloads after each answer (keep_alive 0); SMOL_A made room for it each time, least recently used.
    wait_for(lambda: states(server)[SMOL_B]["state"] == "unloaded", "keep_alive 0 unloads smol-b")
    after = states(server)
    assert after[BASE]["loads"] == 1 and after[BASE]["unloads"] == 0  # pinned
    assert after[SMOL_B]["loads"] == 2 and after[SMOL_B]["unloads"] == 2
    assert after[SMOL_A]["unloads"] == 2
    assert rss_bytes(server) < two_models + 64 * 2**20  # each unload gave its memory back
    log = server.log()
    assert "model smol-b unloaded (keep_alive 0)" in log and "model smol-a unloaded (to make room for smol-b)" in log


def test_concurrent_requests_for_three_models_wait_for_room_and_are_all_answered(server: Server) -> None:
    with ThreadPoolExecutor(6) as pool:
        answers = list(pool.map(lambda model: ask(server, model), [SMOL_A, SMOL_B, BASE] * 2))
    assert all(answers)
    metrics = server.http().get("/metrics").text
    assert 'tokenrelay_model_loads_total{model="smol-b"}' in metrics
    assert 'tokenrelay_model_resident{model="gemma"} 1.0' in metrics


def test_the_operator_loads_and_unloads_by_hand(server: Server) -> None:
    wait_for(lambda: states(server)[SMOL_B]["state"] == "unloaded", "smol-b idle and unloaded")
    with admin(server) as http:
        loaded = http.post(f"/admin/models/{SMOL_B}/load")
        assert loaded.status_code == 200 and loaded.json()["state"] == "loaded"
        assert states(server)[SMOL_A]["state"] == "unloaded"  # made room
        unloaded = http.post(f"/admin/models/{SMOL_B}/unload")
        assert unloaded.status_code == 200 and unloaded.json()["state"] == "unloaded"
        assert http.post("/admin/models/nope/load").status_code == 404
    with server.http() as anonymous:
        assert anonymous.post(f"/admin/models/{SMOL_A}/load").status_code == 401


def test_the_models_command_lists_loads_and_unloads(server: Server) -> None:
    def models(*args: str) -> str:
        command = [sys.executable, "-m", "tokenrelay", "models", *args, "--url", server.base_url]
        env = server_env({"TOKENRELAY_ADMIN_KEY": ADMIN, "PYTHONPATH": str(SRC)})
        done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=120)
        assert done.returncode == 0, done.stderr
        return done.stdout

    assert "loaded" in models("load", SMOL_A)
    listing = models("list")
    assert all(model in listing for model in (BASE, SMOL_A, SMOL_B))
    assert "unloaded" in models("unload", SMOL_A)
    assert states(server)[SMOL_A]["state"] == "unloaded"


def test_an_embedding_request_and_a_batch_line_load_an_unloaded_model(server: Server) -> None:
    client = server.client()
    wait_for(lambda: states(server)[SMOL_B]["state"] == "unloaded", "smol-b unloaded")
    loads = states(server)[SMOL_B]["loads"]
    vectors = client.embeddings.create(model=SMOL_B, input=["a colour", "a shape"])
    assert len(vectors.data) == 2 and len(vectors.data[0].embedding) > 0
    wait_for(lambda: states(server)[SMOL_B]["state"] == "unloaded", "keep_alive 0 unloads smol-b again")
    batch = wait_ended(client, submit(client, [chat_line("one", "Say hi.", model=SMOL_B)]))
    assert batch.status == "completed" and batch.request_counts is not None and batch.request_counts.completed == 1
    assert states(server)[SMOL_B]["loads"] == loads + 2
