"""A real `tokenrelay serve` process on loopback, driven with the official `openai` client."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
from openai import OpenAI

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "src"
SUPPORT = Path(__file__).resolve().parent  # helper scripts the tests start as processes
DEFAULT_MODEL = "gemma-3-270m"
# Replicas that share this machine split its cores, as the README says to: llama.cpp's threads spin while they wait
# for each other, so two engines with a thread per core each slow every step about tenfold.
SHARED_CORES = {"TOKENRELAY_ENGINE__THREADS": "1"}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass
class Server:
    """A running `tokenrelay serve` subprocess."""

    process: subprocess.Popen[bytes]
    port: int
    log_path: Path

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def client(self, api_key: str = "none", **kwargs: object) -> OpenAI:
        return OpenAI(base_url=f"{self.base_url}/v1", api_key=api_key, max_retries=0, **kwargs)

    def http(self, **kwargs: object) -> httpx.Client:
        return httpx.Client(base_url=self.base_url, timeout=120, **kwargs)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def log_lines(self) -> list[str]:
        """The log's complete lines. The server writes its log in blocks that need not end at a line's end, and a
        reader may see part of a block, so a last line without its newline is still being written: left out."""
        text = self.log()
        return text[: text.rfind("\n") + 1].splitlines()

    def stop(self, sig: int | None = None) -> int:
        if self.process.poll() is None:
            if sig is None:
                self.process.terminate()
            else:
                self.process.send_signal(sig)
            try:
                self.process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        return self.process.returncode


def server_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TOKENRELAY_")}
    env["PYTHONPATH"] = os.pathsep.join([str(SRC), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env.update(extra or {})
    return env


def start_server(
    tmp: Path, *args: str, env: dict[str, str] | None = None, data_dir: Path | None = None, wait: bool = True
) -> Server:
    """Start `python -m tokenrelay serve` on a free loopback port and wait until /health says ready."""
    port = free_port()
    log_path = tmp / f"server-{port}.log"
    data = data_dir or shared_data_dir()
    command = [sys.executable, "-m", "tokenrelay", "serve", "--port", str(port), "--data-dir", str(data), *args]
    with log_path.open("wb") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=server_env(env))
    server = Server(process, port, log_path)
    if wait:
        wait_ready(server)
    return server


def wait_ready(server: Server, timeout: float = 180, path: str = "/health") -> None:
    """Until `GET path` answers 200 (a tokenrelay's `/health`; another server's own page); the log's tail in
    the error if the server dies or never does."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.process.poll() is not None:
            raise RuntimeError(f"server exited early ({server.process.returncode}):\n{server.log()[-4000:]}")
        try:
            if httpx.get(f"{server.base_url}{path}", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    server.stop()
    raise RuntimeError(f"server did not become ready:\n{server.log()[-4000:]}")


def shared_data_dir() -> Path:
    """One data dir for the whole test run, so the default model is assembled once."""
    path = Path(os.environ.get("TOKENRELAY_TEST_DATA_DIR", ROOT / ".pytest_cache" / "tokenrelay-data"))
    path.mkdir(parents=True, exist_ok=True)
    return path
