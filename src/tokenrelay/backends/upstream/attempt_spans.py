"""One span per attempt on a member (a node or the embedded engine), when traces are exported: which member, the
how-many-th attempt, and why it failed when the request moved on to the next."""

from __future__ import annotations

import contextlib
from typing import Protocol

from opentelemetry import trace
from opentelemetry.trace import Span, SpanKind, Status, StatusCode, Tracer

from tokenrelay.backends.upstream.failures import NodeFailure


class Named(Protocol):
    name: str
    kind: str


def attempt_span(tracer: Tracer | None, member: Named, attempt: int) -> Span | None:
    """A client span, a child of the current span (the call's); None when untraced."""
    if tracer is None:
        return None
    attributes: dict[str, str | int] = {
        "tokenrelay.node": member.name,
        "tokenrelay.member_kind": member.kind,
        "tokenrelay.attempt": attempt,
    }
    return tracer.start_span(f"{member.kind} {member.name}", kind=SpanKind.CLIENT, attributes=attributes)


_UNTRACED = contextlib.nullcontext()  # reusable: it holds nothing


def use_span(span: Span | None) -> contextlib.AbstractContextManager[object]:
    """The attempt's span as the current one, only around code that does not yield to the caller."""
    return _UNTRACED if span is None else trace.use_span(span, end_on_exit=False)


def end_attempt(span: Span | None, failure: NodeFailure | None = None) -> None:
    if span is None:
        return
    if failure is not None:
        span.set_attribute("tokenrelay.retry_reason", failure.reason)
        span.set_status(Status(StatusCode.ERROR, failure.reason))
    span.end()
