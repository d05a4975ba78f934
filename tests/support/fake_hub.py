"""A fake Hugging Face Hub on loopback: just the part of the Hub's HTTP protocol `huggingface_hub` uses to list
a model repo and download its files into its cache.

- `GET /api/models/{org}/{repo}`: the repo's commit and file names (`HfApi.model_info`'s `sha` and `siblings`);
- `HEAD` and `GET /{org}/{repo}/resolve/{revision}/{path}` (`hf_hub_download`): the file's metadata in the
  headers the library reads (X-Repo-Commit, ETag, Content-Length), and its bytes (`Range: bytes=N-` resumes);
- the Hub's error answers: 404 with `X-Error-Code: RepoNotFound` or `EntryNotFound`.

Files are bytes, or paths on disk streamed as they are (a 100 MB GGUF is never read into memory).
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

import pytest
from threaded_http import NodeServer, running

File = bytes | Path
COMMIT = "0123456789abcdef0123456789abcdef01234567"  # every repo's `main` (a commit hash is 40 hex digits)
_INFO = re.compile(r"/api/models/(?P<repo>[^/]+/[^/]+)")
_RESOLVE = re.compile(r"/(?P<repo>[^/]+/[^/]+)/resolve/(?P<revision>[^/]+)/(?P<path>.+)")
_RANGE = re.compile(r"bytes=(\d+)-$")


@dataclass
class FakeHub:
    """The repos served (repo id -> path in the repo -> content) and what was asked of them."""

    repos: dict[str, dict[str, File]]
    url: str = ""
    requests: list[tuple[str, str, str | None]] = field(default_factory=list)  # method, path, Authorization
    _etags: dict[int, str] = field(default_factory=dict)

    def downloads(self) -> list[str]:
        """The paths of the file bodies sent (GET /resolve), in order."""
        return [path for method, path, _ in self.requests if method == "GET" and "/resolve/" in path]

    def etag(self, content: File) -> str:
        if id(content) not in self._etags:
            if isinstance(content, Path):
                with content.open("rb") as file:
                    digest = hashlib.file_digest(file, "sha256").hexdigest()
            else:
                digest = hashlib.sha256(content).hexdigest()
            self._etags[id(content)] = digest
        return self._etags[id(content)]


class _HubHandler(BaseHTTPRequestHandler):
    server: _HubServer  # HTTP/1.0: a connection per request, so a stopped hub answers nothing more

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        self._answer(body=True)

    def do_HEAD(self) -> None:
        self._answer(body=False)

    def _answer(self, body: bool) -> None:
        hub = self.server.hub
        hub.requests.append((self.command, self.path, self.headers.get("Authorization")))
        path = self.path.split("?", 1)[0]
        if info := _INFO.fullmatch(path):
            self._info(hub, info["repo"])
        elif resolve := _RESOLVE.fullmatch(path):
            self._file(hub, resolve["repo"], resolve["path"], body)
        else:
            self._error(404, "", {})

    def _info(self, hub: FakeHub, repo_id: str) -> None:
        files = hub.repos.get(repo_id)
        if files is None:
            self._error(404, "RepoNotFound", {})
            return
        info = {"id": repo_id, "sha": COMMIT, "siblings": [{"rfilename": name} for name in files]}
        self._send(200, {"Content-Type": "application/json"}, json.dumps(info).encode())

    def _file(self, hub: FakeHub, repo_id: str, name: str, body: bool) -> None:
        files = hub.repos.get(repo_id)
        if files is None:
            self._error(404, "RepoNotFound", {})
            return
        data = files.get(name)
        if data is None:
            self._error(404, "EntryNotFound", {"X-Repo-Commit": COMMIT})
            return
        size = _size(data)
        start = int(match[1]) if (match := _RANGE.match(self.headers.get("Range", ""))) else 0
        headers = {"X-Repo-Commit": COMMIT, "ETag": f'"{hub.etag(data)}"', "Accept-Ranges": "bytes"}
        if start:
            headers["Content-Range"] = f"bytes {start}-{size - 1}/{size}"
        self._start(206 if start else 200, headers, size - start)
        if body:
            _write(self.wfile, data, start)

    def _error(self, status: int, code: str, headers: dict[str, str]) -> None:
        self._send(status, {**headers, "X-Error-Code": code} if code else headers, b"")

    def _send(self, status: int, headers: dict[str, str], data: bytes) -> None:
        self._start(status, headers, len(data))
        if self.command != "HEAD":
            self.wfile.write(data)

    def _start(self, status: int, headers: dict[str, str], length: int) -> None:
        self.send_response(status)
        for name, value in headers.items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(length))
        self.end_headers()


class _HubServer(NodeServer):
    def __init__(self, hub: FakeHub) -> None:
        super().__init__(("127.0.0.1", 0), _HubHandler)
        self.hub = hub


def _size(data: File) -> int:
    return data.stat().st_size if isinstance(data, Path) else len(data)


def _write(out: Any, data: File, start: int) -> None:
    if isinstance(data, bytes):
        out.write(data[start:])
        return
    with data.open("rb") as file:
        file.seek(start)
        shutil.copyfileobj(file, out, 1 << 20)


@contextmanager
def fake_hub(repos: dict[str, dict[str, File]]) -> Iterator[FakeHub]:
    """The repos served on a free loopback port until the block ends; `hub.url` is what HF_ENDPOINT names."""
    hub = FakeHub(repos)
    server = _HubServer(hub)
    with running(server):
        hub.url = f"http://127.0.0.1:{server.server_address[1]}"
        yield hub


def point_library_at(monkeypatch: pytest.MonkeyPatch, endpoint: str, home: Path, offline: bool = False) -> None:
    """`huggingface_hub` in this process as HF_ENDPOINT, HF_HOME and HF_HUB_OFFLINE would set it in a new one.

    The library reads those variables once, at import, into its `constants` module; its own tests patch that
    module the same way.
    """
    from huggingface_hub import constants

    for name, value in hub_env(endpoint, home, offline).items():
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(constants, "ENDPOINT", endpoint)
    monkeypatch.setattr(constants, "HUGGINGFACE_CO_URL_TEMPLATE", endpoint + "/{repo_id}/resolve/{revision}/{filename}")
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(home / "hub"))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", offline)
    monkeypatch.setattr(constants, "HF_TOKEN_PATH", str(home / "token"))


def hub_env(endpoint: str, home: Path, offline: bool = False) -> dict[str, str]:
    """The environment that points a new process's `huggingface_hub` at `endpoint`, with its cache in `home`."""
    return {
        "HF_ENDPOINT": endpoint,
        "HF_HOME": str(home),
        "HF_HUB_CACHE": str(home / "hub"),  # over one the test run's own environment may set
        "HF_HUB_OFFLINE": "1" if offline else "0",
        "HF_TOKEN": "",  # no token of the machine's goes to the fake
    }
