"""Text runs: the plain deltas of one node read travel as one event and render as the chunks they stand for."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from event_loops import on_both_loops

from tokenrelay.api.sse import frames
from tokenrelay.backends.base import Event, Events, Finish, Served, TextDelta, TextRun, TokenLogprob, Usage
from tokenrelay.backends.upstream.wire import coalesced
from tokenrelay.calls.record import Call
from tokenrelay.openai.chat.render import ChatChunker
from tokenrelay.openai.completions.render import CompletionChunker
from tokenrelay.openai.render import ResponseMeta

TEXTS = ["plain", ' "quoted" ', "Héllo wörld ✓", "line\nbreak", "\u2028sep", "tab\t\\", "\x00nul", "🦊"]
LOGPROB = TokenLogprob("x", -0.5, [120], [])


def meta(**fields: object) -> ResponseMeta:
    base = {"id": "chatcmpl-1", "created": 1700000000, "model": "m", "system_fingerprint": "fp_1", "choices": 2}
    return ResponseMeta(**(base | fields))  # type: ignore[arg-type]


def chunkers() -> list[ChatChunker | CompletionChunker]:
    return [
        ChatChunker(meta(), want_logprobs=False),
        ChatChunker(meta(include_usage=True, service_tier="default"), want_logprobs=True),
        ChatChunker(meta(model='a "quoted" model'), want_logprobs=False, legacy_functions=True),
        CompletionChunker(meta(), want_logprobs=False),
        CompletionChunker(meta(include_usage=True), want_logprobs=True),
    ]


def frames_of(chunker: ChatChunker | CompletionChunker, event: Event) -> bytes:
    return frames(chunker.event(event))


@pytest.mark.parametrize("chunker", chunkers(), ids=lambda c: type(c).__name__)
@pytest.mark.parametrize("index", [0, 1])
def test_a_run_renders_byte_for_byte_as_one_delta_per_text(
    chunker: ChatChunker | CompletionChunker, index: int
) -> None:
    one_by_one = b"".join(frames_of(chunker, TextDelta(index, text)) for text in TEXTS)
    assert frames_of(chunker, TextRun(index, list(TEXTS))) == one_by_one
    assert one_by_one.count(b"data: ") == len(TEXTS)


def test_a_text_orjson_refuses_is_written_escaped() -> None:
    chunker = ChatChunker(meta(), want_logprobs=False)
    texts = ["ok", "lone \ud800 surrogate"]
    rendered = frames_of(chunker, TextRun(0, texts))
    assert rendered == b"".join(frames_of(chunker, TextDelta(0, text)) for text in texts)
    assert b'"lone \\ud800 surrogate"' in rendered  # escaped as the node sent it: valid JSON, valid UTF-8


@on_both_loops
async def test_the_chat_role_chunks_go_out_with_the_first_content_and_silent_events_make_no_piece() -> None:
    async def events() -> AsyncIterator[Events]:
        yield [Served("node-a", "upstream")]  # shows nothing in the stream
        yield [TextRun(0, ["a", "b"])]
        yield [Usage(1, 2)]  # not asked for in the stream: no chunks
        yield [Finish(0, "stop")]

    chunker = ChatChunker(meta(choices=1), want_logprobs=False)
    pieces = [piece async for piece in chunker.chunks(events())]
    assert [len(piece) for piece in pieces] == [3, 1]  # the opening with "a" and "b", then the finish
    assert pieces[0][0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert [chunk["choices"][0]["delta"] for chunk in pieces[0][1:]] == [{"content": "a"}, {"content": "b"}]
    assert pieces[1][0]["choices"][0]["finish_reason"] == "stop"


def test_coalesced_joins_consecutive_plain_deltas_of_one_choice_only() -> None:
    events = [
        TextDelta(0, "a"),
        TextDelta(0, "b"),
        TextDelta(1, "c"),  # another choice: a run of its own
        TextDelta(1, "d"),
        TextDelta(1, "e"),
        TextDelta(0, "f", [LOGPROB]),  # logprobs: kept as it is
        TextDelta(0, "g"),
        TextDelta(0, ""),  # no text: kept as it is
        Finish(0, "stop"),
        TextDelta(0, "h"),
        Usage(1, 2),
    ]
    assert coalesced(events) == [
        TextRun(0, ["a", "b"]),
        TextRun(1, ["c", "d", "e"]),
        TextDelta(0, "f", [LOGPROB]),
        TextDelta(0, "g"),
        TextDelta(0, ""),
        Finish(0, "stop"),
        TextDelta(0, "h"),
        Usage(1, 2),
    ]
    assert coalesced([TextDelta(0, "lone")]) == [TextDelta(0, "lone")]


def test_a_call_counts_a_run_as_its_tokens_with_a_gap_before_each_but_the_first() -> None:
    call = Call(request_id="r", endpoint="chat.completions", model="m")
    call.saw(TextDelta(0, "a"))
    call.saw(TextRun(0, ["b", "c", "d"]))
    assert call.tokens_seen == 4
    assert call.first_token_at is not None
    assert len(call.token_gaps) == 3  # as for four deltas: one gap between each two tokens
    assert call.token_gaps[1:] == [0.0, 0.0]  # those of a run arrived together
