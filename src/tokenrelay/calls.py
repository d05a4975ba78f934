"""One record per API call, filled in as the response is produced and handed to observers at the end.

This is the single seam for accounting: the usage ledger, metrics and the per-request log line all read
a finished `Call`, whichever backend served it and whether it streamed, failed or was cancelled.
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

from tokenrelay.backends.base import Event, Finish, Served, TextDelta, ToolCallDelta, Usage

log = logging.getLogger(__name__)


@dataclass
class Call:
    request_id: str
    endpoint: str  # "chat.completions" | "completions"
    model: str
    streamed: bool = False
    backend: str = ""
    node: str | None = None  # the upstream node (or "embedded") that answered, for routed models
    key_id: str | None = None
    key_name: str | None = None
    user: str | None = None
    status: int = 200
    error: str | None = None
    cancelled: bool = False
    usage: Usage = field(default_factory=Usage)
    finish_reasons: list[str] = field(default_factory=list)
    started: float = field(default_factory=time.monotonic)
    started_at: float = field(default_factory=time.time)
    first_token_at: float | None = None
    ended: float | None = None
    token_gaps: list[float] = field(default_factory=list)
    _last_token: float | None = None
    reported: bool = False

    @property
    def ttft(self) -> float | None:
        return None if self.first_token_at is None else self.first_token_at - self.started

    @property
    def latency(self) -> float:
        return (self.ended or time.monotonic()) - self.started

    def saw(self, event: Event) -> None:
        if isinstance(event, TextDelta | ToolCallDelta):
            now = time.monotonic()
            if self.first_token_at is None:
                self.first_token_at = now
            elif self._last_token is not None:
                self.token_gaps.append(now - self._last_token)
            self._last_token = now
        elif isinstance(event, Finish):
            self.finish_reasons.append(event.reason)
        elif isinstance(event, Usage):
            self.usage = event
        elif isinstance(event, Served):
            self.node, self.backend = event.node, event.kind


Observer = Callable[[Call], None]


async def observed(events: AsyncIterator[Event], call: Call, done: Callable[[Call], None]) -> AsyncIterator[Event]:
    """Pass events through, recording them on `call`; report the call exactly once however it ends."""
    try:
        async for event in events:
            call.saw(event)
            yield event
    except BaseException as exc:
        record_failure(call, exc)
        raise
    finally:
        call.ended = time.monotonic()
        done(call)


def record_failure(call: Call, exc: BaseException) -> None:
    from tokenrelay.errors import APIError

    if isinstance(exc, APIError):
        call.status, call.error = exc.status, exc.code or exc.type
    elif isinstance(exc, GeneratorExit | KeyboardInterrupt) or type(exc).__name__ == "CancelledError":
        call.cancelled, call.status = True, 499  # client closed the request
    else:
        call.status, call.error = 500, type(exc).__name__
