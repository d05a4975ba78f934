"""A finished `Call` → one ledger row."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from tokenrelay.calls.record import Call

if TYPE_CHECKING:
    from opentelemetry.trace import SpanContext
from tokenrelay.limits.limiter import Reservation
from tokenrelay.store.ids import time_ordered_id


@dataclass(slots=True)  # not frozen: made per request, and a frozen dataclass's __init__ is dearer
class LedgerEntry:
    values: dict[str, Any]  # the `usage` row
    reservation: Reservation | None
    span_context: SpanContext | None = None  # the call's span, when traced: the ledger write's span links to it

    @property
    def id(self) -> str:
        return self.values["id"]

    @property
    def batch_line(self) -> bool:
        """A batch line's row, which replaces the rows of the line's earlier runs (`writer.py`)."""
        return self.values["batch_id"] is not None

    @property
    def tokens(self) -> int:
        return self.values["prompt_tokens"] + self.values["completion_tokens"]

    @property
    def cost(self) -> int:
        return self.values["cost"]


def last_use(entries: Iterable[LedgerEntry]) -> dict[str, datetime]:
    """The latest end of each key's calls among the entries (for the keys' `last_used_at`)."""
    last: dict[str, datetime] = {}
    for entry in entries:
        key_id, ended = entry.values["key_id"], entry.values["ended_at"]
        if key_id is not None and (key_id not in last or ended > last[key_id]):
            last[key_id] = ended
    return last


def _utc(epoch: float) -> datetime:
    return datetime.fromtimestamp(epoch, UTC).replace(tzinfo=None)


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000, 3)


def entry_for(call: Call) -> LedgerEntry:
    usage = call.usage
    values = {
        "id": time_ordered_id(),  # the ledger's idempotency key: a retried write inserts each row once
        "request_id": call.request_id,
        "key_id": call.key_id,
        "key_name": call.key_name,
        "endpoint": call.endpoint,
        "model": call.model,
        "backend": call.backend,
        "streamed": call.streamed,
        "status": call.status,
        "error": call.error,
        "cancelled": call.cancelled,
        "finish_reasons": ",".join(call.finish_reasons),
        "prompt_tokens": usage.prompt_tokens,
        "completion_tokens": usage.completion_tokens,
        "cached_tokens": usage.cached_tokens,
        "usage_estimated": usage.estimated,
        "ttft_ms": _ms(call.ttft),
        "latency_ms": _ms(call.latency),
        "user": call.user,
        "started_at": _utc(call.started_at),
        "ended_at": _utc(call.started_at + call.latency),
        "batch_id": call.batch_id,
        "cost": call.cost,
        "priced": call.priced,
        "served_model": call.served_model,
    }
    return LedgerEntry(values, call.reservation, None if call.span is None else call.span.get_span_context())
