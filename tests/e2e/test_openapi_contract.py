"""The published OpenAPI document is true: schemathesis, with every check, against a real server.

It generates requests from `/openapi.json` (valid ones and invalid ones), sends each with an admin key, and
checks the answers against the document: statuses, bodies, content types, `Allow` on a 405, no 5xx, valid
requests accepted and invalid ones refused. Node registrations run last, on their own: a registered node
that does not exist makes its model's generations fail with 502, as it should.

It runs as a user would, in the checkout: `schemathesis.toml` names the hooks that keep generated requests
within the rules no JSON Schema can state and within what the default models can do (each listed with its
reason in `tests/support/contract_hooks.py`), and keeps generations short. Every phase runs: the document's
examples, the coverage phase's boundary values, fuzzing and the stateful links.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from servers import ROOT, Server, server_env, start_server, wait_ready

ADMIN_KEY = "sk-admin-contract-test"
REGISTER_NODE = "POST /admin/nodes"


@pytest.fixture(scope="module")
def contract_server(tmp_path_factory: pytest.TempPathFactory) -> Server:
    tmp = tmp_path_factory.mktemp("contract")
    env = {"TOKENRELAY_ADMIN_KEY": ADMIN_KEY, "TOKENRELAY_ENGINE__SLOTS": "2"}
    # A database of its own: the run creates keys, which would lock the shared test server's database.
    srv = start_server(tmp, "--database-url", f"sqlite:///{tmp / 'contract.db'}", env=env, wait=False)
    wait_ready(srv, timeout=600)  # both default models load first, slowly on a busy machine
    yield srv
    srv.stop()


def schemathesis_run(server: Server, tmp: Path, *selection: str) -> subprocess.CompletedProcess[str]:
    command = [
        shutil.which("schemathesis") or str(Path(sys.executable).with_name("schemathesis")),
        "run",
        f"{server.base_url}/openapi.json",
        "--checks",
        "all",
        "--max-examples",
        "8",
        "--request-timeout",
        "60",
        "--workers",
        "1",
        "--seed",
        "1",
        "-H",
        f"Authorization: Bearer {ADMIN_KEY}",
        "--report-dir",
        str(tmp),
        *selection,
    ]
    env = server_env({"NO_COLOR": "1"})
    # In the checkout, where schemathesis finds `schemathesis.toml` (and the hooks it names).
    return subprocess.run(command, capture_output=True, text=True, env=env, timeout=900, check=False, cwd=ROOT)


@pytest.mark.timeout(1200)
def test_every_operation_keeps_the_published_contract(contract_server: Server, tmp_path: Path) -> None:
    for selection in (("--exclude-name", REGISTER_NODE), ("--include-name", REGISTER_NODE)):
        run = schemathesis_run(contract_server, tmp_path, *selection)
        report = run.stdout[-6000:] + run.stderr[-2000:]
        assert run.returncode == 0, report
        assert "No failures" in run.stdout or " passed" in run.stdout, report
