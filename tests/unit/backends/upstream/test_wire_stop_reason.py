"""A node's `stop_reason` (vLLM's, and tokenrelay's own) says which stop sequence ended a choice."""

from __future__ import annotations

from tokenrelay.api.collect import Collected
from tokenrelay.backends.base import Finish
from tokenrelay.backends.upstream.wire import chat_events
from tokenrelay.openai.chat.render import ChatChunker, chat_response
from tokenrelay.openai.render import ResponseMeta


def finish_of(choice: dict[str, object]) -> Finish:
    [event] = [e for e in chat_events({"choices": [choice]}, "delta") if isinstance(e, Finish)]
    return event


def test_a_string_stop_reason_is_the_matched_stop_sequence() -> None:
    assert finish_of({"index": 0, "delta": {}, "finish_reason": "stop", "stop_reason": "END"}).stop_sequence == "END"


def test_a_token_id_or_no_stop_reason_is_no_stop_sequence() -> None:
    assert finish_of({"index": 0, "delta": {}, "finish_reason": "stop", "stop_reason": 2}).stop_sequence is None
    assert finish_of({"index": 0, "delta": {}, "finish_reason": "stop"}).stop_sequence is None


def test_tokenrelay_sends_stop_reason_only_when_a_stop_sequence_matched() -> None:
    meta = ResponseMeta(id="x", created=0, model="m", system_fingerprint="fp", choices=1)
    chunker = ChatChunker(meta, want_logprobs=False)
    [matched] = chunker.event(Finish(0, "stop", "END"))
    [plain] = chunker.event(Finish(0, "stop"))
    assert matched["choices"][0]["stop_reason"] == "END"
    assert "stop_reason" not in plain["choices"][0]
    collected = Collected()
    collected.add(Finish(0, "stop", "END"))
    body = chat_response(collected, meta, want_logprobs=False)
    assert body["choices"][0]["stop_reason"] == "END"
    assert finish_of(body["choices"][0] | {"delta": {}}).stop_sequence == "END"
