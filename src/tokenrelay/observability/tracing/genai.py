"""The attributes and events of OpenTelemetry's GenAI semantic conventions, read off a call and its request.

No prompt, completion or key is ever an attribute unless `telemetry.capture_content` is on; a key's *name* (an
operator's label, not a secret) and the request id are, so a trace can be matched to the ledger and the log.
"""

from __future__ import annotations

import json
from typing import Any

from opentelemetry.trace import Span, Status, StatusCode
from pydantic import BaseModel

from tokenrelay.calls.record import Call

# tokenrelay's endpoint names -> `gen_ai.operation.name`
OPERATIONS = {
    "chat.completions": "chat",
    "completions": "text_completion",
    "responses": "chat",
    "messages": "chat",
    "embeddings": "embeddings",
}
# request field -> attribute, where the body has the field and the client set it
_REQUEST_FIELDS = {
    "temperature": "gen_ai.request.temperature",
    "top_p": "gen_ai.request.top_p",
    "top_k": "gen_ai.request.top_k",
    "seed": "gen_ai.request.seed",
    "frequency_penalty": "gen_ai.request.frequency_penalty",
    "presence_penalty": "gen_ai.request.presence_penalty",
}
_CONTENT_FIELDS = {"messages", "prompt", "input"}


def request_attributes(call: Call, body: Any, capture: bool) -> dict[str, Any]:
    attributes: dict[str, Any] = {
        "gen_ai.operation.name": OPERATIONS.get(call.endpoint, call.endpoint),
        "gen_ai.request.model": call.model,
        "tokenrelay.request_id": call.request_id,
    }
    if call.key_name is not None:
        attributes["tokenrelay.key.name"] = call.key_name
    limit = getattr(body, "token_limit", None)
    if limit is not None:
        attributes["gen_ai.request.max_tokens"] = limit
    choices = getattr(body, "choices", 1)
    if isinstance(choices, int) and choices != 1:
        attributes["gen_ai.request.choice.count"] = choices
    for name, attribute in _REQUEST_FIELDS.items():
        value = getattr(body, name, None)
        if isinstance(value, int | float):
            attributes[attribute] = value
    stops = getattr(body, "stop_list", None)
    if stops:
        attributes["gen_ai.request.stop_sequences"] = list(stops)
    if capture and isinstance(body, BaseModel):
        content = body.model_dump(mode="json", include=_CONTENT_FIELDS, exclude_none=True)
        attributes["gen_ai.input.messages"] = json.dumps(content, ensure_ascii=False)
    return attributes


def finish(span: Span, call: Call) -> None:
    """The call's outcome on its span: the model, usage, finish reasons, the node, the first token's time."""
    usage = call.usage
    attributes: dict[str, Any] = {
        "gen_ai.response.model": call.model,
        "gen_ai.usage.input_tokens": usage.prompt_tokens,
        "gen_ai.usage.output_tokens": usage.completion_tokens,
        "tokenrelay.backend": call.backend,
        "tokenrelay.usage.estimated": usage.estimated,
    }
    if usage.cached_tokens:
        attributes["gen_ai.usage.cache_read.input_tokens"] = usage.cached_tokens
    if call.finish_reasons:
        attributes["gen_ai.response.finish_reasons"] = list(call.finish_reasons)
    if call.node is not None:
        attributes["tokenrelay.node"] = call.node
    if call.cancelled:
        attributes["tokenrelay.cancelled"] = True
    if call.captured is not None:
        attributes["gen_ai.output.messages"] = "".join(call.captured)
    span.set_attributes(attributes)
    if call.first_token_at is not None:
        at = call.started_at + (call.first_token_at - call.started)
        span.add_event("gen_ai.first_token", timestamp=int(at * 1e9))
    if call.error is not None:
        span.set_attribute("error.type", call.error)
        if call.status >= 500:
            span.set_status(Status(StatusCode.ERROR, call.error))
