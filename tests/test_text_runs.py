"""Text runs: the plain deltas of one node read travel as one event and render as the chunks they stand for."""

from __future__ import annotations

import json

import pytest

from tokenrelay.backends.base import Event, Finish, TextDelta, TextRun, TokenLogprob, Usage
from tokenrelay.backends.upstream.wire import coalesced
from tokenrelay.calls import Call
from tokenrelay.render.chat import ChatChunker
from tokenrelay.render.common import ResponseMeta
from tokenrelay.render.completions import CompletionChunker
from tokenrelay.sse import frame

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


@pytest.mark.parametrize("chunker", chunkers(), ids=lambda c: type(c).__name__)
@pytest.mark.parametrize("index", [0, 1])
def test_a_run_renders_byte_for_byte_as_one_delta_per_text(
    chunker: ChatChunker | CompletionChunker, index: int
) -> None:
    one_by_one = b"".join(frame(chunker.event(TextDelta(index, text))) for text in TEXTS)
    assert chunker.runs.frames(TextRun(index, list(TEXTS))) == one_by_one
    assert chunker.runs.frames(TextRun(index, list(TEXTS))) == one_by_one  # from the kept template


def test_a_text_orjson_refuses_falls_back_to_the_chunk_by_chunk_encoding() -> None:
    chunker = ChatChunker(meta(), want_logprobs=False)
    texts = ["ok", "lone \ud800 surrogate"]
    rendered = chunker.runs.frames(TextRun(0, texts))
    assert rendered == b"".join(frame(chunker.event(TextDelta(0, text))) for text in texts)
    assert b'"lone \\ud800 surrogate"' in rendered  # escaped as the node sent it: valid JSON, valid UTF-8


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


@pytest.mark.parametrize("chunker", chunkers(), ids=lambda c: type(c).__name__)
def test_a_run_with_its_nodes_json_strings_renders_them_as_they_are(chunker: ChatChunker | CompletionChunker) -> None:
    # The node's own escaping (Python's json: non-ASCII as \u escapes, "/" escaped), not orjson's.
    encoded = [json.dumps(text).encode() for text in TEXTS] + [b'"a\\/b"']
    texts = [*TEXTS, "a/b"]
    rendered = chunker.runs.frames(TextRun(0, texts, encoded))
    frames = rendered.split(b"\n\n")[:-1]
    one_by_one = b"".join(frame(chunker.event(TextDelta(0, text))) for text in texts).split(b"\n\n")[:-1]
    assert [json.loads(f.removeprefix(b"data: ")) for f in frames] == [
        json.loads(f.removeprefix(b"data: ")) for f in one_by_one
    ]
    for sent, piece in zip(encoded, frames, strict=True):
        assert sent in piece  # copied, not encoded again
    assert b"\\u00e9" in rendered  # "é" as the node wrote it


def test_a_plain_delta_before_an_encoded_run_joins_it_encoded_and_none_after_it() -> None:
    run = TextRun(0, ["b", "c"], [b'"b"', b'"\\u0063"'])
    joined = coalesced([TextDelta(0, "a"), run, TextDelta(0, "d"), Finish(0, "stop")])
    assert joined == [TextRun(0, ["a", "b", "c"]), TextDelta(0, "d"), Finish(0, "stop")]
    assert joined[0].encoded == [b'"a"', b'"b"', b'"\\u0063"']  # type: ignore[union-attr]
    plain = coalesced([TextDelta(0, "x"), TextDelta(0, "y"), TextRun(0, ["z"], [b'"z"'])])
    assert plain == [TextRun(0, ["x", "y", "z"])] and plain[0].encoded == [b'"x"', b'"y"', b'"z"']  # type: ignore[union-attr]


@pytest.mark.parametrize(
    "before",
    [TextDelta(1, "other choice"), TextDelta(0, "x", [LOGPROB]), TextDelta(0, "lone \ud800"), Finish(0, "stop")],
    ids=["other-choice", "logprobs", "lone-surrogate", "not-text"],
)
def test_an_encoded_run_takes_in_nothing_but_plain_text_orjson_can_write(before: Event) -> None:
    run = TextRun(0, ["b"], [b'"b"'])
    assert coalesced([before, run]) == [before, run]
    assert run.encoded == [b'"b"']
