"""What the ledger needs from a node's answer in the Responses or Messages API, read as it passes through.

A native relay passes the node's bytes on unchanged; these readers look at the same answer (its JSON body, or
its stream's events) for the node's usage, the text generated (for an estimate when the node reports no usage),
whether the stream reached its last event, and an error the node sent in place of an answer.
"""

from __future__ import annotations

from typing import Any

from tokenrelay.backends.base import NativeApi, NodeStored, TextDelta, Usage
from tokenrelay.backends.upstream.metering import Meter
from tokenrelay.backends.upstream.relay import json_object, reported_error
from tokenrelay.backends.upstream.sse_parse import SSEMessage
from tokenrelay.jsonbytes import dumps

# The events that end a stream: after them the answer is complete.
_LAST_EVENTS: dict[NativeApi, frozenset[str]] = {
    "responses": frozenset({"response.completed", "response.incomplete", "response.failed"}),
    "messages": frozenset({"message_stop"}),
}


class AnswerReader:
    """Reads one native answer for usage and text; `meter` makes the estimate when the node reports no usage."""

    def __init__(self, api: NativeApi, meter: Meter) -> None:
        self.api = api
        self.meter = meter
        self.finished = False  # the stream's last event came (a whole body is complete by itself)
        self._usage: dict[str, int] = {}
        self._stored: list[NodeStored] = []  # what the node keeps, not yet passed on

    def stored(self) -> list[NodeStored]:
        """The ids the node keeps that were read since the last call (a stored response's, once)."""
        stored, self._stored = self._stored, []
        return stored

    def _keep(self, response: Any) -> None:
        # A response object says whether the node stores it; one that does not say follows the API's default.
        if isinstance(response, dict) and isinstance(response.get("id"), str) and response.get("store") is not False:
            self._stored.append(NodeStored(response["id"]))

    # A whole body ---------------------------------------------------------------------------------
    def body(self, content: bytes) -> None:
        """Read a whole JSON answer; an error body (or one that is not a JSON object) is the node's failure."""
        body = json_object(content)
        if _is_error(self.api, body):
            raise reported_error(content)
        self._take_usage(body.get("usage"))
        if self.api == "responses":
            self._keep(body)
        for text in _body_texts(self.api, body):
            self.meter.saw(TextDelta(0, text))
        self.finished = True

    # A stream ---------------------------------------------------------------------------------------
    def events(self, messages: list[SSEMessage], *, first: bool) -> None:
        """Read the events of one read. Before anything went to the client (`first`), an error event is the
        node's failure, so another node may serve; after that it is part of the answer, relayed as it is."""
        for message in messages:
            event = _event(message)
            if event is None:
                continue
            kind = str(event.get("type") or message.event)
            if first and kind == "error":
                raise reported_error(message.data)
            self._stream_event(kind, event)

    def _stream_event(self, kind: str, event: dict[str, Any]) -> None:
        if self.api == "responses":
            if kind == "response.output_text.delta" or kind == "response.function_call_arguments.delta":
                self._text(event.get("delta"))
            elif kind == "response.created":
                self._keep(event.get("response"))
            elif kind in _LAST_EVENTS["responses"]:
                response = event.get("response")
                self._take_usage(response.get("usage") if isinstance(response, dict) else None)
        elif kind == "message_start":
            message = event.get("message")
            self._take_usage(message.get("usage") if isinstance(message, dict) else None)
        elif kind == "message_delta":
            self._take_usage(event.get("usage"))  # the final counts: they update those of message_start
        elif kind == "content_block_delta":
            delta = event.get("delta")
            if isinstance(delta, dict):
                self._text(delta.get("text") or delta.get("partial_json"))
        if kind in _LAST_EVENTS[self.api]:
            self.finished = True

    def _text(self, text: Any) -> None:
        if isinstance(text, str) and text:
            self.meter.saw(TextDelta(0, text))

    # Usage -----------------------------------------------------------------------------------------
    def _take_usage(self, usage: Any) -> None:
        if not isinstance(usage, dict):
            return
        counts = _counts(usage)
        if self.api == "responses":
            details = usage.get("input_tokens_details")
            cached = details.get("cached_tokens") if isinstance(details, dict) else None
            if isinstance(cached, int):
                counts["cached"] = cached
        self._usage |= counts

    def usage(self) -> Usage:
        """The node's usage (Messages: input plus tokens read from its cache is the prompt), or the estimate
        from what the node sent, marked as such."""
        if "input_tokens" not in self._usage and "output_tokens" not in self._usage:
            return self.meter.usage()
        prompt = self._usage.get("input_tokens", 0)
        cached = self._usage.get("cached", 0)
        if self.api == "messages":
            cached = self._usage.get("cache_read_input_tokens", 0)
            prompt += cached
        return Usage(prompt_tokens=prompt, completion_tokens=self._usage.get("output_tokens", 0), cached_tokens=cached)


def _counts(usage: dict[str, Any]) -> dict[str, int]:
    names = ("input_tokens", "output_tokens", "cache_read_input_tokens")
    return {name: value for name in names if isinstance(value := usage.get(name), int)}


def _is_error(api: NativeApi, body: dict[str, Any]) -> bool:
    # A response object always has an `error` field (null unless it failed): only a body that is not a
    # response object is an error answer.
    if api == "responses":
        return isinstance(body.get("error"), dict) and body.get("object") != "response"
    return body.get("type") == "error"


def _body_texts(api: NativeApi, body: dict[str, Any]) -> list[str]:
    """The generated text of a whole answer (output text, tool arguments), for an estimate."""
    texts: list[str] = []
    if api == "responses":
        for item in _dicts(body.get("output")):
            if isinstance(item.get("arguments"), str):
                texts.append(item["arguments"])
            texts += [part["text"] for part in _dicts(item.get("content")) if isinstance(part.get("text"), str)]
        return texts
    for block in _dicts(body.get("content")):
        if isinstance(block.get("text"), str):
            texts.append(block["text"])
        elif block.get("type") == "tool_use":
            texts.append(dumps(block.get("input")).decode())
    return texts


def _dicts(value: Any) -> list[dict[str, Any]]:
    return [item for item in value if isinstance(item, dict)] if isinstance(value, list) else []


def _event(message: SSEMessage) -> dict[str, Any] | None:
    """One event's JSON payload; None for one that is not a JSON object (relayed all the same: the stream is
    the node's to write, and the reader only looks at it)."""
    if not message.data.strip():
        return None
    try:
        event = message.json()
    except ValueError:
        return None
    return event if isinstance(event, dict) else None
