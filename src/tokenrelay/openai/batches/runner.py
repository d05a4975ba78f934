"""Runs batches: validates new ones, runs their lines through the app itself, and ends them with their files.

Every server process runs one runner; they share the work through the database (`store.py`'s claims), so a
batch's lines are spread over every replica and worker, and a replica that dies leaves its claims to go
stale and be taken again. At most `batches.concurrency` lines run at once per process, and on the embedded
engine they run as background work, in the slots interactive requests leave.

A line answered 429 for a rate limit (not a spent budget) or 503 (a full queue, no node up) is put back and
runs again later: batch work waits for capacity instead of failing for it.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from starlette.types import ASGIApp

from tokenrelay.config import BatchSettings
from tokenrelay.jsonbytes import dumps, loads
from tokenrelay.openai.batches.dispatch import Answer, dispatch
from tokenrelay.openai.batches.lines import check_input
from tokenrelay.openai.batches.render import usage_of
from tokenrelay.openai.batches.results import line_result, stopped_line
from tokenrelay.principal import ADMIN_KEY, ANONYMOUS, STATIC_KEY, Principal
from tokenrelay.store.batches import BatchStore, ClaimedLine
from tokenrelay.store.files import new_file_values
from tokenrelay.store.ids import time_ordered_id

log = logging.getLogger(__name__)

# Answers that mean "not now" rather than "not this request".
_RETRY_LATER = frozenset({429, 503})
_SPECIAL_KEYS = {None: ANONYMOUS, STATIC_KEY.key_id: STATIC_KEY, ADMIN_KEY.key_id: ADMIN_KEY}

PrincipalOf = Callable[[str], Awaitable[Principal | None]]
Usable = Callable[[Principal, str], str | None]
Flush = Callable[[], Awaitable[None]]


class BatchRunner:
    def __init__(
        self,
        store: BatchStore,
        settings: BatchSettings,
        max_n: int,
        principal_of: PrincipalOf,
        usable: Usable,
        flush_ledger: Flush,
    ) -> None:
        self.store = store
        self._flush_ledger = flush_ledger
        self.settings = settings
        self.max_n = max_n
        self._principal_of = principal_of
        self._usable = usable
        self.claim = time_ordered_id()  # this process's claims
        self._app: ASGIApp | None = None
        self._task: asyncio.Task[None] | None = None
        self._running: dict[tuple[str, int], asyncio.Task[None]] = {}
        self._wake = asyncio.Event()
        self._paused_until = 0.0
        self._renewed = time.monotonic()
        self.lines_done = 0
        self.states: dict[str, int] = {}  # batches by state, as of the last step (for /metrics)

    def start(self, app: ASGIApp) -> None:
        self._app = app
        self._task = asyncio.create_task(self._run(), name="batch-runner")

    def wake(self) -> None:
        """Something changed (a batch created or cancelled): look now rather than at the next poll."""
        self._wake.set()

    async def close(self, drain: float) -> None:
        """Stop taking lines; give the running ones `drain` seconds to finish, then put the rest back."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        running = list(self._running.values())
        if running:
            log.info("batches: waiting up to %.0f s for %d running line(s)", drain, len(running))
            await asyncio.wait(running, timeout=drain)
        for task in running:
            task.cancel()
        await asyncio.gather(*running, return_exceptions=True)

    async def _run(self) -> None:
        while True:
            try:
                await self._step()
            except asyncio.CancelledError:
                raise
            except Exception:  # the database away for a moment: the next poll tries again
                log.exception("batches: a runner step failed")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), timeout=self.settings.poll_seconds)
            self._wake.clear()

    async def _step(self) -> None:
        self.states = await self.store.counts_by_status()
        for batch in await self.store.validating():
            await self._validate(batch)
        for batch, state in await self.store.ending(self.settings.lease_seconds):
            await self._end(batch, state)
        if time.monotonic() - self._renewed > self.settings.lease_seconds / 4:
            await self.store.renew(self.claim)
            self._renewed = time.monotonic()
        free = self.settings.concurrency - len(self._running)
        if free > 0 and time.monotonic() >= self._paused_until:
            for line in await self.store.claim(self.claim, free, self.settings.lease_seconds):
                task = asyncio.create_task(self._run_line(line), name=f"batch-line-{line.batch_id}-{line.line}")
                self._running[(line.batch_id, line.line)] = task
                task.add_done_callback(functools.partial(self._done, (line.batch_id, line.line)))

    def _done(self, key: tuple[str, int], _: asyncio.Task[None]) -> None:
        self._running.pop(key, None)
        self._wake.set()  # a slot is free: claim the next line now

    async def _validate(self, batch: dict[str, Any]) -> None:
        content = await self.store.input_content(batch["input_file_id"])
        principal = await self.principal(batch["key_id"])
        if content is None or principal is None:
            why = "The input file was not found." if content is None else "The batch's API key was revoked."
            await self.store.fail(batch["id"], [_error("invalid_file" if content is None else "invalid_key", why)])
            return

        def usable(model: str) -> str | None:
            return self._usable(principal, model)

        checked = check_input(content, batch["endpoint"], self.settings.max_lines, self.max_n, usable)
        if checked.errors:
            await self.store.fail(batch["id"], checked.errors)
        elif await self.store.start(batch["id"], checked.lines):
            log.info("batch %s: %d line(s) to run", batch["id"], len(checked.lines))

    async def principal(self, key_id: str | None) -> Principal | None:
        if key_id in _SPECIAL_KEYS:
            return _SPECIAL_KEYS[key_id]
        return await self._principal_of(key_id)  # type: ignore[arg-type]

    async def _run_line(self, line: ClaimedLine) -> None:
        request_id = f"{line.batch_id}-{line.line}"
        try:
            principal = await self.principal(line.key_id)
            if principal is None:
                answer = Answer(401, dumps({"error": _error("invalid_api_key", "The batch's API key was revoked.")}))
            else:
                assert self._app is not None
                answer = await dispatch(
                    self._app, line.endpoint, dumps(line.body), principal, line.batch_id, request_id
                )
            if answer.status in _RETRY_LATER and not _spent(answer):
                await self.store.release(line, self.claim)
                self._paused_until = time.monotonic() + 1.0
                return
            # A line marked done never runs again, so its ledger row is committed first: a kill between the two
            # runs the line again, and its row (the same id) is not written twice.
            await self._flush_ledger()
            if await self.store.finish(line, self.claim, line_result(line, request_id, answer.status, answer.body)):
                self.lines_done += 1
        except asyncio.CancelledError:
            with contextlib.suppress(Exception):
                await asyncio.shield(self.store.release(line, self.claim))
            raise
        except Exception:
            log.exception("batch %s line %d: could not be run; it will be tried again", line.batch_id, line.line)
            with contextlib.suppress(Exception):
                await self.store.release(line, self.claim)

    async def _end(self, batch: dict[str, Any], state: str) -> None:
        lines = await self.store.done_lines(batch["id"])
        outputs: list[dict[str, Any]] = []
        errors: list[dict[str, Any]] = []
        for line in lines:
            if line["state"] == "done":
                (outputs if line["status_code"] < 400 else errors).append(line["result"])
            elif state in ("expired", "cancelled"):
                errors.append(stopped_line(line, state))
        written = [self._file(batch, kind, rows) for kind, rows in (("output", outputs), ("error", errors)) if rows]
        values = {
            "completed": len(outputs),
            "failed": len(errors),
            "usage": usage_of(lines),
            "output_file_id": next((f["id"] for kind, f in written if kind == "output"), None),
            "error_file_id": next((f["id"] for kind, f in written if kind == "error"), None),
        }
        if await self.store.end(batch, state, values, [f for _, f in written]):
            log.info("batch %s %s: %d answered, %d in the error file", batch["id"], state, len(outputs), len(errors))

    def _file(self, batch: dict[str, Any], kind: str, rows: list[dict[str, Any]]) -> tuple[str, dict[str, Any]]:
        content = b"".join(jsonl_line(row) for row in rows)
        name = f"{batch['id']}_{kind}.jsonl"
        values = new_file_values(batch["key_id"], name, "batch_output", content, self.settings.output_retention_days)
        return kind, values


# Characters JSON leaves raw inside strings but Python's `str.splitlines` (and some other readers) take for line
# ends: NEL, LINE SEPARATOR, PARAGRAPH SEPARATOR. Written as escapes, a model's text never splits a line.
_LINE_ENDS_IN_STRINGS = ((b"\xc2\x85", b"\\u0085"), (b"\xe2\x80\xa8", b"\\u2028"), (b"\xe2\x80\xa9", b"\\u2029"))


def jsonl_line(row: dict[str, Any]) -> bytes:
    """One line of a batch's output or error file: the row's JSON, with nothing inside that reads as a line end."""
    line = dumps(row)
    for raw, escaped in _LINE_ENDS_IN_STRINGS:
        line = line.replace(raw, escaped)
    return line + b"\n"


def _spent(answer: Answer) -> bool:
    """A 429 for a spent budget is the line's answer (it would never pass); other 429s wait."""
    try:
        return loads(answer.body)["error"]["code"] == "insufficient_quota"
    except (ValueError, KeyError, TypeError):
        return False


def _error(code: str, message: str) -> dict[str, Any]:
    return {"code": code, "message": message, "param": None, "line": None}
