"""`truncation: auto` drops the oldest items until the backend takes the conversation; `disabled` refuses."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

import pytest

from tokenrelay.backends.base import Event, Events, Finish, TextDelta
from tokenrelay.errors import InvalidRequest
from tokenrelay.openai.responses import translate
from tokenrelay.openai.responses.serving import fitted, parse
from tokenrelay.protocol.chat import ChatCompletionRequest


class SmallContext:
    """A backend whose context holds at most `limit` messages (the engine's error, before any event)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.seen: list[list[str]] = []

    def chat(self, request: ChatCompletionRequest, ticket: object) -> AsyncIterator[Events]:
        return self._chat(request)

    async def _chat(self, request: ChatCompletionRequest) -> AsyncIterator[Events]:
        self.seen.append([m.text() for m in request.messages])
        if len(request.messages) > self.limit:
            raise InvalidRequest("too long", param="messages", code="context_length_exceeded")
        yield [TextDelta(0, "ok"), Finish(0, "stop")]


def run(truncation: str, limit: int) -> tuple[list[Event], SmallContext]:
    items = [{"role": "user", "content": f"q{i}"} for i in range(4)]
    body = parse(json.dumps({"model": "m", "input": items, "instructions": "sys", "truncation": truncation}).encode())
    conversation = translate.Conversation([], translate.input_items(body))
    chat = translate.chat_request(body, conversation)
    backend = SmallContext(limit)

    async def events() -> list[Event]:
        return [e async for batch in fitted(backend, body, conversation, chat, "r") for e in batch]  # type: ignore[arg-type]

    return asyncio.run(events()), backend


def test_auto_leaves_out_the_oldest_items_and_keeps_the_instructions() -> None:
    events, backend = run("auto", limit=3)
    assert isinstance(events[0], TextDelta)
    assert backend.seen[-1] == ["sys", "q2", "q3"]
    assert len(backend.seen) == 3


def test_disabled_refuses_a_conversation_that_does_not_fit() -> None:
    with pytest.raises(InvalidRequest) as caught:
        run("disabled", limit=3)
    assert caught.value.code == "context_length_exceeded"


def test_auto_gives_up_when_even_the_last_item_does_not_fit() -> None:
    with pytest.raises(InvalidRequest):
        run("auto", limit=1)
