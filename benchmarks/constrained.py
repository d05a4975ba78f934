"""Constrained decoding speed: JSON-schema-constrained chat completions against the same prompts unconstrained.

Prints aggregate completion tokens/s of each kind, alone (1 stream) and with 8 concurrent streams, and the
constrained rate as a fraction of the unconstrained one (target: at least 80%). The two kinds are measured in
alternating rounds so that load from other processes on the machine falls on both alike. `engine.py` calls
`constrained_report` against its own server; run alone, this starts a server of its own:

    python benchmarks/constrained.py [--max-tokens 64] [--rounds 2]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "support"))

from servers import start_server  # noqa: E402

TOPICS = ["a lighthouse", "a bakery", "a comet", "a library", "a glacier", "a violin", "a harbour", "a forest"]
# Both schemas need more than max_tokens to complete (minItems), so every request of either kind produces
# exactly max_tokens tokens and the two rates compare like for like. Mostly strings: the costliest states to mask,
# since nearly the whole vocabulary is allowed inside a string and every token has to be checked.
SCHEMAS: list[dict[str, Any]] = [
    {
        "type": "object",
        "properties": {
            "title": {"type": "string", "maxLength": 60},
            "year": {"type": "integer", "minimum": 1000, "maximum": 2100},
            "kind": {"enum": ["place", "object", "event"]},
            "facts": {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {"fact": {"type": "string", "maxLength": 80}, "confidence": {"type": "number"}},
                    "required": ["fact", "confidence"],
                },
                "minItems": 30,
            },
        },
        "required": ["title", "year", "kind", "facts"],
    },
    {"type": "array", "items": {"type": "string", "maxLength": 60}, "minItems": 60},
]


@dataclass
class Rate:
    tokens: int = 0
    seconds: float = 0.0
    requests: int = 0

    @property
    def tok_s(self) -> float:
        return self.tokens / self.seconds if self.seconds else 0.0


def bodies(model: str, count: int, max_tokens: int, constrained: bool) -> list[dict[str, Any]]:
    out = []
    for i in range(count):
        body: dict[str, Any] = {
            "model": model,
            "messages": [{"role": "user", "content": f"Describe {TOPICS[i % len(TOPICS)]} as a JSON record."}],
            "max_tokens": max_tokens,
            "temperature": 0.7,
            "seed": i,
        }
        if constrained:
            schema = SCHEMAS[i % len(SCHEMAS)]
            body["response_format"] = {"type": "json_schema", "json_schema": {"name": "record", "schema": schema}}
        out.append(body)
    return out


async def run(base: str, work: list[dict[str, Any]], concurrency: int) -> Rate:
    """All requests through `concurrency` workers (each starts the next as soon as one ends)."""
    queue: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
    for body in work:
        queue.put_nowait(body)
    rate = Rate()

    async def worker(client: httpx.AsyncClient) -> None:
        while not queue.empty():
            response = await client.post("/v1/chat/completions", json=queue.get_nowait())
            response.raise_for_status()
            rate.tokens += response.json()["usage"]["completion_tokens"]
            rate.requests += 1

    async with httpx.AsyncClient(base_url=base, timeout=600) as client:
        started = time.perf_counter()
        await asyncio.gather(*(worker(client) for _ in range(concurrency)))
        rate.seconds = time.perf_counter() - started
    return rate


def add(total: Rate, part: Rate) -> None:
    total.tokens += part.tokens
    total.seconds += part.seconds
    total.requests += part.requests


def compare(base: str, model: str, concurrency: int, max_tokens: int, rounds: int) -> tuple[Rate, Rate]:
    plain, constrained = Rate(), Rate()
    for _ in range(rounds):
        count = max(concurrency * 2, 4)
        add(plain, asyncio.run(run(base, bodies(model, count, max_tokens, False), concurrency)))
        add(constrained, asyncio.run(run(base, bodies(model, count, max_tokens, True), concurrency)))
    return plain, constrained


def constrained_report(base: str, model: str, max_tokens: int = 64, rounds: int = 3) -> list[str]:
    # Warm-up: the first constrained request builds the grammar tokenizer (a few seconds, once per model).
    asyncio.run(run(base, bodies(model, 1, 4, True), 1))
    lines = []
    for concurrency in (1, 8):
        plain, constrained = compare(base, model, concurrency, max_tokens, rounds)
        lines.append(
            f"constrained decoding c={concurrency}: {constrained.tok_s:6.1f} tok/s vs {plain.tok_s:6.1f} unconstrained"
            f" = {constrained.tok_s / plain.tok_s:4.0%} (target >= 80%)"
            f"  [mean tokens/request {constrained.tokens / constrained.requests:.0f} vs"
            f" {plain.tokens / plain.requests:.0f}]"
        )
        print(f"  {lines[-1]}", flush=True)
    return lines


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    server = start_server(Path(tempfile.mkdtemp(prefix="bench-constrained-")), "--slots", "8")
    try:
        constrained_report(server.base_url, "gemma-3-270m", args.max_tokens, args.rounds)
    finally:
        server.stop()


if __name__ == "__main__":
    main()
