"""`python -m llama_cpp.server` as a third-party node for the relay tests.

Started through `llama_cpp_node.py`, the launcher that keeps repacked (AMX) weights off, and waited for until it
lists its models.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from servers import SUPPORT, Server, free_port, wait_ready


def start_llama_node(tmp: Path, gguf: Path, alias: str, *extra: str, n_ctx: int = 1024) -> Server:
    """The node serving `gguf` as `alias` on loopback (`extra`: more of the server's own options)."""
    port = free_port()
    log_path = tmp / f"llama-node-{port}.log"
    command = [sys.executable, str(SUPPORT / "llama_cpp_node.py"), "--model", str(gguf), "--host", "127.0.0.1"]
    command += ["--port", str(port), "--n_threads", "1", "--n_ctx", str(n_ctx), "--model_alias", alias, *extra]
    with log_path.open("wb") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
    return Server(process, port, log_path)


def wait_models(server: Server, timeout: float = 120) -> None:
    """Until the node answers `GET /v1/models` (it has no `/health`)."""
    wait_ready(server, timeout, path="/v1/models")
