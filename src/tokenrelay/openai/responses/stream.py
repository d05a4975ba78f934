"""A backend's events → the Responses API's stream events, in OpenAI's order, numbered from 0.

`response.created` and `response.in_progress` go out with the first content, so that a request the backend
refuses before producing anything (context too long, an unsupported part) still gets a plain HTTP error.
A text answer opens a message item and its one `output_text` part; each tool call is a `function_call` item
whose arguments stream between its `output_item.added` and `.done`; an item is closed before the next opens.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from tokenrelay.api.collect import reasoning_text
from tokenrelay.backends.base import DeltaFields, Event, Finish, TextDelta, TextRun, ToolCallDelta, Usage
from tokenrelay.errors import APIError
from tokenrelay.openai.responses.ids import new_id
from tokenrelay.openai.responses.render import (
    ResponseHead,
    custom_input,
    error_body,
    function_call_item,
    message_item,
    outcome,
    reasoning_item,
    response_object,
    text_part,
)

Payload = dict[str, Any]


@dataclass
class OpenItem:
    """The output item being streamed: its index, its item (as added), and its text or arguments so far."""

    index: int
    item: dict[str, Any]
    pieces: list[str] = field(default_factory=list)


class ResponseStream:
    """The stream's state: sequence numbers, the output so far, the item being streamed."""

    def __init__(self, head: ResponseHead) -> None:
        self.head = head
        self.sequence = 0
        self.started = False
        self.output: list[dict[str, Any]] = []
        self.open: OpenItem | None = None
        self.finish_reason: str | None = None
        self.usage: Usage | None = None

    def payload(self, kind: str, **fields: Any) -> Payload:
        body = {"type": kind, **fields, "sequence_number": self.sequence}
        self.sequence += 1
        return body

    def opening(self) -> list[Payload]:
        if self.started:
            return []
        self.started = True
        snapshot = response_object(self.head, "in_progress", [])
        return [
            self.payload("response.created", response=snapshot),
            self.payload("response.in_progress", response=snapshot),
        ]

    # Events -------------------------------------------------------------------------------------
    def event(self, event: Event) -> list[Payload]:
        """The payloads one backend event becomes (none for an event the stream does not show)."""
        if isinstance(event, TextRun) and event.index == 0:
            return self._texts(event.texts)
        if isinstance(event, TextDelta) and event.index == 0 and event.text:
            return self._texts([event.text])
        if isinstance(event, ToolCallDelta) and event.index == 0:
            return self._tool_call(event)
        if isinstance(event, DeltaFields) and event.index == 0 and (thinking := reasoning_text(event.fields)):
            return self._reasoning(thinking)
        if isinstance(event, Finish) and event.index == 0:
            self.finish_reason = event.reason
        elif isinstance(event, Usage):
            self.usage = event
        return []

    def _texts(self, texts: list[str]) -> list[Payload]:
        out = self.opening()
        if self.open is None or self.open.item["type"] != "message":
            out += self._close()
            out += self._open(message_item(new_id("msg"), "in_progress", []))
            part = self._where(content_index=0)
            out.append(self.payload("response.content_part.added", **part, part=text_part("")))
        assert self.open is not None
        where = self._where(content_index=0)
        for text in texts:
            self.open.pieces.append(text)
            out.append(self.payload("response.output_text.delta", **where, delta=text, logprobs=[]))
        return out

    def _reasoning(self, text: str) -> list[Payload]:
        out = self.opening()
        if self.open is None or self.open.item["type"] != "reasoning":
            out += self._close()
            out += self._open(reasoning_item(new_id("rs"), "in_progress", "") | {"content": []})
        assert self.open is not None
        self.open.pieces.append(text)
        out.append(self.payload("response.reasoning_text.delta", **self._where(content_index=0), delta=text))
        return out

    def _tool_call(self, event: ToolCallDelta) -> list[Payload]:
        out = self.opening()
        current = self.open
        if current is None or current.item.get("_index") != event.call_index:
            out += self._close()
            call_id = event.id or new_id("call")
            item = function_call_item(self.head.body, new_id("fc"), call_id, event.name or "", "", "in_progress")
            out += self._open(item | {"_index": event.call_index})
        assert self.open is not None
        if event.arguments:
            self.open.pieces.append(event.arguments)
            # A custom tool's text is inside its JSON arguments: it goes out whole when the call ends (`_close`).
            if self.open.item["type"] == "function_call":
                delta = event.arguments
                out.append(self.payload("response.function_call_arguments.delta", **self._where(), delta=delta))
        return out

    def _where(self, **extra: int) -> dict[str, Any]:
        assert self.open is not None
        return {"item_id": self.open.item["id"], "output_index": self.open.index, **extra}

    def _open(self, item: dict[str, Any]) -> list[Payload]:
        self.open = OpenItem(len(self.output), item)
        return [self.payload("response.output_item.added", output_index=self.open.index, item=_public(item))]

    def _close(self, status: str = "completed") -> list[Payload]:
        """The payloads that finish the open item, which joins the output."""
        current, self.open = self.open, None
        if current is None:
            return []
        joined = "".join(current.pieces)
        where = {"item_id": current.item["id"], "output_index": current.index}
        if current.item["type"] == "reasoning":
            item = reasoning_item(current.item["id"], status, joined)
            out = [self.payload("response.reasoning_text.done", **where, content_index=0, text=joined)]
        elif current.item["type"] == "message":
            part = text_part(joined)
            item = message_item(current.item["id"], status, [part])
            out = [
                self.payload("response.output_text.done", **where, content_index=0, text=joined, logprobs=[]),
                self.payload("response.content_part.done", **where, content_index=0, part=part),
            ]
        elif current.item["type"] == "custom_tool_call":
            text = custom_input(joined)
            item = _public(current.item) | {"input": text, "status": status}
            out = [
                self.payload("response.custom_tool_call_input.delta", **where, delta=text),
                self.payload("response.custom_tool_call_input.done", **where, input=text),
            ]
        else:
            item = _public(current.item) | {"arguments": joined, "status": status}
            done = self.payload("response.function_call_arguments.done", **where, name=item["name"], arguments=joined)
            out = [done]
        self.output.append(item)
        return [*out, self.payload("response.output_item.done", output_index=current.index, item=item)]

    # The end ------------------------------------------------------------------------------------
    def final(self) -> tuple[dict[str, Any], list[Payload]]:
        """The finished response, and the payloads that end the stream (`response.completed` or `.incomplete`)."""
        status, incomplete = outcome(self.finish_reason)
        out = self.opening()
        if not self.output and self.open is None:  # an empty answer is still one (empty) message
            out += self._texts([])
        out += self._close("incomplete" if incomplete else "completed")
        response = response_object(self.head, status, self.output, self.usage or Usage(), incomplete=incomplete)
        return response, [*out, self.payload(f"response.{status}", response=response)]

    def failed(self, exc: APIError) -> tuple[dict[str, Any], list[Payload]]:
        """After the first byte: an `error` event, then `response.failed` with what was produced."""
        out = self._close("incomplete")
        error = self.payload("error", code=exc.code or exc.type, message=exc.message, param=exc.param)
        response = response_object(self.head, "failed", self.output, self.usage, error=error_body(exc))
        return response, [*out, error, self.payload("response.failed", response=response)]


def _public(item: dict[str, Any]) -> dict[str, Any]:
    return {name: value for name, value in item.items() if not name.startswith("_")}
