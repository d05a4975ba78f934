"""A real OTLP/HTTP traces receiver on loopback: it decodes each export with OpenTelemetry's own protobuf messages
and keeps the spans, for tests to read as a tree."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue


@dataclass
class ReceivedSpan:
    service: str
    name: str
    trace_id: str
    span_id: str
    parent_id: str
    kind: int
    attributes: dict[str, Any]
    events: dict[str, dict[str, Any]]
    start_ns: int
    end_ns: int
    links: list[tuple[str, str]]  # (trace id, span id) of each linked span


def _value(value: AnyValue) -> Any:
    kind = value.WhichOneof("value")
    if kind == "array_value":
        return [_value(v) for v in value.array_value.values]
    return getattr(value, kind) if kind else None


def _attributes(pairs: Any) -> dict[str, Any]:
    return {pair.key: _value(pair.value) for pair in pairs}


@dataclass
class Receiver:
    url: str
    spans: list[ReceivedSpan] = field(default_factory=list)
    lock: threading.RLock = field(default_factory=threading.RLock)

    def take(self, body: bytes) -> None:
        request = ExportTraceServiceRequest.FromString(body)
        for resource in request.resource_spans:
            service = _attributes(resource.resource.attributes).get("service.name", "")
            for scope in resource.scope_spans:
                for span in scope.spans:
                    received = ReceivedSpan(
                        service=service,
                        name=span.name,
                        trace_id=span.trace_id.hex(),
                        span_id=span.span_id.hex(),
                        parent_id=span.parent_span_id.hex(),
                        kind=span.kind,
                        attributes=_attributes(span.attributes),
                        events={e.name: _attributes(e.attributes) | {"_time": e.time_unix_nano} for e in span.events},
                        start_ns=span.start_time_unix_nano,
                        end_ns=span.end_time_unix_nano,
                        links=[(link.trace_id.hex(), link.span_id.hex()) for link in span.links],
                    )
                    with self.lock:
                        self.spans.append(received)

    def wait_for(self, found: Callable[[list[ReceivedSpan]], Any], timeout: float = 30.0) -> Any:
        """`found(spans)`'s first truthy answer, as exports arrive."""
        deadline = time.monotonic() + timeout
        while True:
            with self.lock:
                answer = found(list(self.spans))
            if answer or time.monotonic() > deadline:
                assert answer, f"spans not received in time; have {[s.name for s in self.spans]}"
                return answer
            time.sleep(0.05)

    def children(self, parent: ReceivedSpan) -> list[ReceivedSpan]:
        with self.lock:
            return [s for s in self.spans if s.parent_id == parent.span_id and s.trace_id == parent.trace_id]


@contextmanager
def otlp_receiver() -> Iterator[Receiver]:
    holder: list[Receiver] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
            holder[0].take(body)
            answer = ExportTraceServiceResponse().SerializeToString()
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", str(len(answer)))
            self.end_headers()
            self.wfile.write(answer)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    holder.append(Receiver(f"http://127.0.0.1:{server.server_port}/v1/traces"))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield holder[0]
    finally:
        server.shutdown()
        server.server_close()
