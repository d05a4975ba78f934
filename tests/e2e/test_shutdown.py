"""SIGTERM while streams are running: short ones finish, long ones are cut at the deadline, every row is written."""

from __future__ import annotations

import asyncio
import signal
from contextlib import nullcontext
from dataclasses import dataclass, field

import openai
import pytest
from accounting_support import create_key, ledger_rows, postgres_database, sqlite_url
from servers import DEFAULT_MODEL, Server, start_server

SHORT, LONG = 3, 4  # streams that finish within the grace period, streams that cannot
WARM_UP = {"X-Request-ID": "warm-up"}
# The default model's end-of-generation tokens, banned in the long streams: a sampled end would let a "long"
# stream finish inside the grace period on a fast enough machine, and then it would not test the cut.
NO_END = {"1": -100, "106": -100, "212": -100}


@dataclass
class Seen:
    request_id: str
    chunks: int = 0  # chunks carrying generated text
    finished: bool = False
    started: asyncio.Event = field(default_factory=asyncio.Event)


async def stream(client: openai.AsyncOpenAI, seen: Seen, max_tokens: int) -> None:
    try:
        reply = await client.completions.create(
            model=DEFAULT_MODEL,
            prompt=f"Story {seen.request_id}:",
            max_tokens=max_tokens,
            stream=True,
            logit_bias=NO_END if seen.request_id.startswith("long") else None,
            extra_headers={"X-Request-ID": seen.request_id},
        )
        async for chunk in reply:
            if chunk.choices and chunk.choices[0].text:
                seen.chunks += 1
                seen.started.set()
            if chunk.choices and chunk.choices[0].finish_reason:
                seen.finished = True
    except (openai.APIError, OSError):
        pass  # the server went away mid-stream: that is the point of the test
    finally:
        seen.started.set()


async def stream_through_sigterm(server: Server, key: str) -> list[Seen]:
    seen = [Seen(f"short-{i}") for i in range(SHORT)] + [Seen(f"long-{i}") for i in range(LONG)]
    async with openai.AsyncOpenAI(base_url=f"{server.base_url}/v1", api_key=key, max_retries=0, timeout=120) as client:
        # The engine's first steps are slow (warm-up); pay for them before the clock of the grace period runs.
        await client.completions.create(model=DEFAULT_MODEL, prompt="warm up", max_tokens=4, extra_headers=WARM_UP)
        tasks = [asyncio.create_task(stream(client, s, 2 if s.request_id.startswith("short") else 900)) for s in seen]
        await asyncio.wait_for(asyncio.gather(*(s.started.wait() for s in seen)), 120)
        server.process.send_signal(signal.SIGTERM)
        await asyncio.wait_for(asyncio.gather(*tasks), 120)
    return seen


@pytest.mark.parametrize("database", ["sqlite", "postgresql"])
def test_sigterm_during_streams_loses_no_row(database: str, tmp_path: object) -> None:
    with postgres_database() if database == "postgresql" else nullcontext(sqlite_url(tmp_path)) as url:
        key = create_key(url, "streams", "--budget-tokens", "1000000")
        server = start_server(tmp_path, "--database-url", url, "--shutdown-timeout", "6")
        try:
            seen = asyncio.run(stream_through_sigterm(server, key))
            # uvicorn re-raises the signal once its graceful shutdown is done, so -SIGTERM is a clean exit here.
            assert server.process.wait(timeout=60) in (0, -signal.SIGTERM)
        finally:
            server.stop()
        log = server.log()
        assert "Application shutdown complete" in log, log[-3000:]
        assert "spill" not in log, log[-3000:]
        rows = {r["request_id"]: r for r in ledger_rows(url)}
        assert set(rows) == {s.request_id for s in seen} | {WARM_UP["X-Request-ID"]}
        for s in seen:
            row = rows[s.request_id]
            if s.request_id.startswith("short"):
                assert s.finished and row["status"] == 200 and row["completion_tokens"] <= 2, row
                assert not row["usage_estimated"] and row["prompt_tokens"] > 0
            else:
                # Cut streams carry the engine's own count of what they consumed: prompt included, not estimated.
                assert not s.finished and row["cancelled"] and not row["usage_estimated"], row
                assert row["completion_tokens"] >= s.chunks >= 1 and row["prompt_tokens"] > 0
        assert "timeout graceful shutdown exceeded" in log  # the long streams were cut, not waited for
