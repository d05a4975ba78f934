"""One record per API call, filled in as the response is produced and handed to observers at the end.

This is the single seam for accounting: the usage ledger, metrics and the per-request log line all read
a finished `Call`, whichever backend served it and whether it streamed, failed or was cancelled.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from tokenrelay.backends.base import (
    Event,
    Events,
    Finish,
    Raw,
    Served,
    TextDelta,
    TextRun,
    Ticket,
    ToolCallDelta,
    Usage,
    aclose_quietly,
)
from tokenrelay.backends.tokens import event_tokens
from tokenrelay.errors import APIError

if TYPE_CHECKING:
    from opentelemetry.trace import Span

    from tokenrelay.limits.limiter import Reservation
    from tokenrelay.principal import Principal


@dataclass
class Call:
    request_id: str
    endpoint: str  # "chat.completions" | "completions" | "responses" | "messages" | "embeddings"
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
    principal: Principal | None = None  # who called (set by authentication)
    reservation: Reservation | None = None  # what admission reserved against the key's limits
    tokens_seen: int = 0  # generated tokens observed in the events, for calls that end without a usage report
    usage_reported: bool = False
    span: Span | None = None  # the call's span, when traces are exported
    trace_token: object = None  # what makes `span` the current span until the call ends
    captured: list[str] | None = None  # the generated text, gathered only when traces capture content
    batch_id: str | None = None  # the batch this call is a line of
    served_model: str | None = None  # the fallback model that served `model`, if one did
    ignored: list[str] = field(default_factory=list)  # request fields accepted without effect (named to the client)
    # Told of a fallback's `Served` as it passes, before the batch is rendered: the answer names the model.
    on_served: Callable[[Served], None] | None = None
    cost: int = 0  # micro-units of the settings' currency, at the serving model's (or node's) prices
    priced: bool = False  # the serving model has prices (an unpriced one costs 0)
    ticket: Ticket = field(init=False)  # what the backend is handed, and what it reports back on the way out

    def __post_init__(self) -> None:
        self.ticket = Ticket(self.request_id)

    @property
    def ttft(self) -> float | None:
        return None if self.first_token_at is None else self.first_token_at - self.started

    @property
    def latency(self) -> float:
        return (self.ended or time.monotonic()) - self.started

    def saw(self, event: Event) -> None:
        if isinstance(event, TextDelta | ToolCallDelta):
            self.tokens_seen += event_tokens(event)
            if self.captured is not None and isinstance(event, TextDelta):
                self.captured.append(event.text)
            self._token_at(time.monotonic())
        elif isinstance(event, TextRun):
            self.tokens_seen += event_tokens(event)
            if self.captured is not None:
                self.captured.extend(event.texts)
            self._token_at(time.monotonic())
            self.token_gaps.extend([0.0] * (len(event.texts) - 1))  # the rest arrived with the first
        elif isinstance(event, Finish):
            self.finish_reasons.append(event.reason)
        elif isinstance(event, Usage):
            self.usage = event
            self.usage_reported = True
        elif isinstance(event, Served):
            self.node, self.backend = event.node, event.kind
            if event.model is not None:
                self.served_model = event.model
                if self.on_served is not None:
                    self.on_served(event)
        elif isinstance(event, Raw) and self.first_token_at is None:
            self.first_token_at = time.monotonic()  # a node's own answer began: its first output, as near as known

    def _token_at(self, now: float) -> None:
        if self.first_token_at is None:
            self.first_token_at = now
        elif self._last_token is not None:
            self.token_gaps.append(now - self._last_token)
        self._last_token = now

    def report_usage(self, usage: Usage) -> None:
        """A backend's own count for a call it could not finish (exact, prompt included)."""
        self.usage = usage
        self.usage_reported = True

    def estimate_usage(self) -> None:
        """For a call cut short (client gone, shutdown, failure) before the backend reported usage: the
        tokens it produced, counted from the events, marked as an estimate. Backends report prompt tokens
        only with the final usage unless they put what they consumed on the call's ticket (the engine does),
        so an aborted call's prompt may be missing from an estimate."""
        if not self.usage_reported and self.tokens_seen:
            self.usage = Usage(completion_tokens=self.tokens_seen, estimated=True)


async def observed(batches: AsyncIterator[Events], call: Call) -> AsyncIterator[Events]:
    """Pass a backend's batches through, recording their events on `call`; however they end, the call then
    has its end time and its usage (estimated where the backend reported none). Reporting it is the
    response's (`api/lifecycle.py`)."""
    try:
        async for events in batches:
            for event in events:
                call.saw(event)
            yield events
    except BaseException as exc:
        record_failure(call, exc)
        raise
    finally:
        # Close the backend's generator first, so whatever it records on the way out (partial usage of a
        # cancelled generation) is on the call before the call is reported.
        await aclose_quietly(batches)
        if call.ticket.consumed is not None:
            call.report_usage(call.ticket.consumed)
        call.ended = time.monotonic()
        call.estimate_usage()


class ClientGone(Exception):
    """The client disconnected before a non-streamed response was ready."""


def record_failure(call: Call, exc: BaseException) -> None:
    if isinstance(exc, APIError):
        call.status, call.error = exc.status, exc.code or exc.type
    elif isinstance(exc, ClientGone | GeneratorExit | KeyboardInterrupt | asyncio.CancelledError):
        call.cancelled, call.status = True, 499  # client closed the request
    else:
        call.status, call.error = 500, type(exc).__name__
