"""Batch API helpers shared by the e2e tests: input lines, submitting, waiting, reading result files, and a server
with two keys on its own database."""

from __future__ import annotations

import io
import json
import time
from pathlib import Path
from typing import Any

import openai
from accounting_support import create_key, sqlite_url
from servers import Server, start_server

CHAT_MODEL = "smollm2-135m-instruct"
FAST = {"TOKENRELAY_BATCHES__POLL_SECONDS": "0.2", "TOKENRELAY_BATCHES__LEASE_SECONDS": "3"}
ENDED = ("completed", "failed", "expired", "cancelled")


def chat_line(custom_id: str, text: str, **body: Any) -> dict[str, Any]:
    request = {"model": CHAT_MODEL, "messages": [{"role": "user", "content": text}], "max_tokens": 6} | body
    return {"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions", "body": request}


def jsonl(lines: list[dict[str, Any]]) -> io.BytesIO:
    return io.BytesIO("\n".join(json.dumps(line) for line in lines).encode())


def submit(client: openai.OpenAI, lines: list[dict[str, Any]], endpoint: str = "/v1/chat/completions") -> str:
    uploaded = client.files.create(file=("input.jsonl", jsonl(lines)), purpose="batch")
    return client.batches.create(input_file_id=uploaded.id, endpoint=endpoint, completion_window="24h").id  # type: ignore[arg-type]


def wait_ended(client: openai.OpenAI, batch_id: str, timeout: float = 120) -> openai.types.Batch:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        batch = client.batches.retrieve(batch_id)
        if batch.status in ENDED:
            return batch
        time.sleep(0.2)
    raise AssertionError(f"batch {batch_id} did not end: {batch}")


def file_lines(client: openai.OpenAI, file_id: str | None) -> list[dict[str, Any]]:
    if file_id is None:
        return []
    return [json.loads(row) for row in client.files.content(file_id).text.splitlines()]


class Deployment:
    def __init__(self, server: Server, url: str, keys: dict[str, str]) -> None:
        self.server, self.url, self.keys = server, url, keys

    def client(self, key: str = "alice") -> openai.OpenAI:
        return self.server.client(api_key=self.keys[key])


def deploy(tmp: Path, env: dict[str, str], url: str | None = None) -> Deployment:
    url = url or sqlite_url(tmp)
    keys = {name: create_key(url, name) for name in ("alice", "bob")}
    return Deployment(start_server(tmp, "--database-url", url, env=FAST | env), url, keys)


def wait_answered(client: openai.OpenAI, batch_id: str, lines: int, timeout: float = 120) -> None:
    """Until at least `lines` of the batch are answered."""
    deadline = time.monotonic() + timeout
    while (counts := client.batches.retrieve(batch_id).request_counts) is None or counts.completed < lines:
        assert time.monotonic() < deadline, f"batch {batch_id}: fewer than {lines} lines answered in time"
        time.sleep(0.1)
