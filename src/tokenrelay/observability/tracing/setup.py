"""OpenTelemetry's SDK set up for one server process: a tracer provider of its own (never the global one),
sampled by `telemetry.sample_ratio`, exported over OTLP/HTTP by a batch processor on its own thread, so exporting
never runs on the request path. With no `telemetry.otlp_endpoint` there is no tracing at all (`tracing_for`
returns None) and the request path makes no span."""

from __future__ import annotations

import logging
from collections.abc import Sequence

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased
from opentelemetry.trace import Tracer

from tokenrelay.config import TelemetrySettings

log = logging.getLogger(__name__)


class Tracing:
    """The process's tracer and what it needs to flush at shutdown."""

    def __init__(self, settings: TelemetrySettings, exporter: SpanExporter) -> None:
        self.settings = settings
        resource = Resource.create({"service.name": settings.service_name})
        self.provider = TracerProvider(resource=resource, sampler=ParentBased(TraceIdRatioBased(settings.sample_ratio)))
        self.provider.add_span_processor(BatchSpanProcessor(QuietExporter(exporter, settings.otlp_endpoint or "")))
        self.tracer: Tracer = self.provider.get_tracer("tokenrelay")

    @property
    def capture_content(self) -> bool:
        return self.settings.capture_content

    def shutdown(self) -> None:
        self.provider.shutdown()


def tracing_for(settings: TelemetrySettings) -> Tracing | None:
    if settings.otlp_endpoint is None:
        return None
    # Imported here: only a server that exports loads the exporter (and protobuf and requests with it).
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    # The exporter's own retries log every failed attempt; `QuietExporter` says it once instead.
    logging.getLogger("opentelemetry.exporter.otlp.proto.http").setLevel(logging.CRITICAL)
    return Tracing(settings, OTLPSpanExporter(endpoint=settings.otlp_endpoint, timeout=5))


class QuietExporter(SpanExporter):
    """An exporter that logs the collector's first failure (and its recovery) once, not every batch: a dead
    collector costs the clients nothing and the log one line."""

    def __init__(self, inner: SpanExporter, endpoint: str) -> None:
        self.inner = inner
        self.endpoint = endpoint
        self.failing = False

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        try:
            result = self.inner.export(spans)
        except Exception:  # the exporter's own bug or a transport error it did not catch: never the caller's
            result = SpanExportResult.FAILURE
        if result is SpanExportResult.FAILURE and not self.failing:
            log.warning(
                "telemetry: the collector at %s refuses traces; spans are dropped until it answers", self.endpoint
            )
        elif result is SpanExportResult.SUCCESS and self.failing:
            log.info("telemetry: the collector at %s takes traces again", self.endpoint)
        self.failing = result is SpanExportResult.FAILURE
        return result

    def shutdown(self) -> None:
        self.inner.shutdown()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return self.inner.force_flush(timeout_millis)
