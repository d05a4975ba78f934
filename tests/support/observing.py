"""Helpers for tests that read what a running server reports: its /metrics and its log."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable
from typing import Any, TypeVar

import httpx
from prometheus_client.parser import text_string_to_metric_families
from servers import Server

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]
T = TypeVar("T")
_PAIR = re.compile(r'(\w+)=("(?:[^"\\]|\\.)*"|\S+)')


def scrape(server: Server, headers: dict[str, str] | None = None) -> Samples:
    response = httpx.get(f"{server.base_url}/metrics", headers=headers or {}, timeout=30)
    response.raise_for_status()
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(response.text)
        for sample in family.samples
    }


def sample(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, frozenset(labels.items())), 0.0)


def grew(before: Samples, after: Samples, name: str, **labels: str) -> float:
    return sample(after, name, **labels) - sample(before, name, **labels)


def eventually(probe: Callable[[], T | None], timeout: float = 15.0) -> T:
    """The probe's first truthy answer, polling until `timeout`."""
    deadline = time.monotonic() + timeout
    while True:
        value = probe()
        if value or time.monotonic() > deadline:
            assert value, "condition not met in time"
            return value
        time.sleep(0.1)


def json_request_lines(server: Server, request_id: str) -> list[dict[str, Any]]:
    lines = [json.loads(line) for line in server.log_lines() if line.startswith("{")]
    return [line for line in lines if line.get("logger") == "tokenrelay.requests" and line["request_id"] == request_id]


def text_request_lines(server: Server, request_id: str) -> list[dict[str, str]]:
    """`key=value` fields of the text-format request lines for one request id (quoted values unquoted)."""
    marker = f"tokenrelay.requests: request request_id={request_id} "
    return [
        {key: json.loads(value) if value.startswith('"') else value for key, value in _PAIR.findall(line)}
        for line in server.log_lines()
        if marker in line
    ]
