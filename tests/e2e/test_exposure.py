"""When a server may run without keys: open on loopback (with a warning), never silently open elsewhere."""

from __future__ import annotations

import time
from pathlib import Path

import httpx
from accounting_support import FAST_CACHE, create_key, sqlite_url
from servers import DEFAULT_MODEL, start_server, wait_ready

BODY = {"model": DEFAULT_MODEL, "prompt": "Hi", "max_tokens": 1}


def test_loopback_without_keys_runs_open_until_a_key_exists(tmp_path: Path) -> None:
    url = sqlite_url(tmp_path)
    server = start_server(tmp_path, "--database-url", url, env=FAST_CACHE)
    try:
        assert "NO AUTHENTICATION" in server.log()
        with server.http() as http:
            assert http.post("/v1/completions", json=BODY).status_code == 200
            # The SDKs always send some key; on an open server a key that is not one is ignored, not refused.
            stray = http.post("/v1/completions", json=BODY, headers={"Authorization": "Bearer unused"})
            assert stray.status_code == 200
            secret = create_key(url, "first")
            deadline = time.monotonic() + 10
            while http.post("/v1/completions", json=BODY).status_code != 401:
                assert time.monotonic() < deadline, "creating a key did not lock the server"
                time.sleep(0.2)
            authorised = http.post("/v1/completions", json=BODY, headers={"Authorization": f"Bearer {secret}"})
            assert authorised.status_code == 200
    finally:
        server.stop()


def test_other_addresses_refuse_to_start_without_keys(tmp_path: Path) -> None:
    server = start_server(tmp_path, "--database-url", sqlite_url(tmp_path), "--host", "0.0.0.0", wait=False)
    try:
        assert server.process.wait(timeout=120) != 0
        assert "refusing to serve on 0.0.0.0 without authentication" in server.log()
    finally:
        server.stop()


def test_insecure_no_auth_and_static_keys_allow_other_addresses(tmp_path: Path) -> None:
    insecure = start_server(
        tmp_path, "--database-url", sqlite_url(tmp_path), "--host", "0.0.0.0", "--insecure-no-auth", wait=False
    )
    try:
        wait_ready(insecure)
        assert "NO AUTHENTICATION" in insecure.log()
    finally:
        insecure.stop()
    env = {"TOKENRELAY_API_KEY": "static-test-key"}
    keyed = start_server(tmp_path, "--database-url", sqlite_url(tmp_path), "--host", "0.0.0.0", env=env, wait=False)
    try:
        wait_ready(keyed)
        assert "NO AUTHENTICATION" not in keyed.log()
        with httpx.Client(base_url=keyed.base_url, timeout=120) as http:
            assert http.post("/v1/completions", json=BODY).status_code == 401
            ok = http.post("/v1/completions", json=BODY, headers={"Authorization": "Bearer static-test-key"})
            assert ok.status_code == 200
    finally:
        keyed.stop()
