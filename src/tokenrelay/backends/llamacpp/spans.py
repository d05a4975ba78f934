"""A generation's trace: one span for the engine's work, with the scheduler's stages as children.

The stages are timed on the scheduler thread (`Job.placed_ns`, `Job.prompt_done_ns`) and made into spans once
the generation is over, so tracing adds nothing to the engine's step."""

from __future__ import annotations

import time

from opentelemetry import trace
from opentelemetry.trace import Span, Tracer
from opentelemetry.util.types import Attributes

from tokenrelay.backends.llamacpp.jobs import Job


def generation_span(tracer: Tracer, model: str, background: bool) -> Span:
    """A child of the current span (the call's)."""
    attributes: Attributes = {
        "gen_ai.system": "llama.cpp",
        "gen_ai.request.model": model,
        "tokenrelay.background": background,
    }
    return tracer.start_span("llama.cpp generate", attributes=attributes)


def end_generation(tracer: Tracer, span: Span, jobs: list[Job], submitted_ns: int) -> None:
    """Queue wait, prompt evaluation and decoding of each job (one per prompt), then the span's own end."""
    now = time.time_ns()
    parent = trace.set_span_in_context(span)
    for job in jobs:
        stages = [("queue", submitted_ns, job.placed_ns or now)]
        if job.placed_ns:
            stages.append(("prompt", job.placed_ns, job.prompt_done_ns or now))
        if job.prompt_done_ns:
            stages.append(("decode", job.prompt_done_ns, now))
        for name, start, end in stages:
            stage = tracer.start_span(name, context=parent, start_time=start)
            if name == "prompt":
                stage.set_attributes(
                    {"tokenrelay.prompt_tokens": len(job.prompt), "tokenrelay.cached_tokens": job.cached_tokens}
                )
            elif name == "decode":
                stage.set_attribute("tokenrelay.completion_tokens", job.completion_tokens)
            stage.end(end_time=end)
    span.end(end_time=now)
