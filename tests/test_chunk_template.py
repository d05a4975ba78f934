"""`ChunkTemplate`: a node's plain chunks read by their bytes give exactly the events a full decoding gives."""

from __future__ import annotations

import json
from typing import Any

import orjson
import pytest

from tokenrelay.backends.base import DeltaFields, Event, TextDelta, TextRun
from tokenrelay.backends.upstream.chunk_template import ChunkTemplate
from tokenrelay.backends.upstream.relay import _read_messages
from tokenrelay.backends.upstream.sse_parse import SSEDecoder
from tokenrelay.backends.upstream.wire import chat_events, coalesced, plain_delta

TEXTS = ["Hé", "llo", ' "quoted" ', "back\\slash", "", "tab\tnew\nline", "😀 emoji", "\u2028", "</script>", "x"]


def chunk(text: str | None, *, index: int = 0, chunk_id: str = "chatcmpl-1", **extra: Any) -> dict[str, Any]:
    delta: dict[str, Any] = {"content": text} if text is not None else {"role": "assistant", "content": ""}
    choice = {"index": index, "delta": delta, "logprobs": None, "finish_reason": None}
    return {"id": chunk_id, "object": "chat.completion.chunk", "created": 7, "model": "m", **extra, "choices": [choice]}


def frames(chunks: list[dict[str, Any]], encode: Any) -> bytes:
    return b"".join(b"data: " + encode(c) + b"\n\n" for c in chunks) + b"data: [DONE]\n\n"


def orjson_style(body: dict[str, Any]) -> bytes:
    return orjson.dumps(body)


def python_style(body: dict[str, Any]) -> bytes:  # what many Python servers write: spaces, non-ASCII escaped
    return json.dumps(body).encode()


def events_of(stream: bytes, size: int, template: ChunkTemplate | None) -> list[Event]:
    """The events of a stream arriving in reads of `size` bytes, coalesced per read as the relay does, each
    run as the deltas it stands for (a learned chunk read alone is a run of one; a decoded one, a delta)."""
    decoder, events = SSEDecoder(), []
    for start in range(0, len(stream), size):
        read: list[Event] = []
        _read_messages(decoder.feed(stream[start : start + size]), chat_events, read, template)
        for event in coalesced(read):
            if isinstance(event, TextRun):
                check_encoded(event)
                events += [TextDelta(event.index, text) for text in event.texts]
            else:
                events.append(event)
    return events


def check_encoded(run: TextRun) -> None:
    """A run's JSON strings, when it has them, are exactly its texts' (one string each, decoded alone)."""
    if run.encoded is not None:
        assert [orjson.loads(encoded) for encoded in run.encoded] == run.texts


@pytest.mark.parametrize("encode", [orjson_style, python_style], ids=["orjson", "python-json"])
@pytest.mark.parametrize("size", [7, 64, 300, 100_000])
def test_read_by_template_or_decoded_in_full_the_events_are_the_same(encode: Any, size: int) -> None:
    stream = frames([chunk(None), *(chunk(t) for t in TEXTS * 3), chunk("tail", index=1)], encode)
    template = ChunkTemplate(plain_delta)
    assert events_of(stream, size, template) == events_of(stream, size, None)
    assert template.head is not None  # learned, so later chunks were read by it


def test_what_is_learned_matches_only_chunks_of_that_shape_and_id() -> None:
    template = ChunkTemplate(plain_delta)
    first = orjson_style(chunk("a"))
    template.learn(first, orjson.loads(first))
    assert template.text(orjson_style(chunk('next "one"'))) == 'next "one"'
    assert template.text(orjson_style(chunk("b", chunk_id="chatcmpl-2"))) is None  # another id: decoded in full
    assert template.text(orjson_style(chunk("b", index=1))) is None
    head, tail = template.head, template.tail
    assert head is not None
    for middle in (b'"a","b"', b'"a"}, "x": {"y": "b"', b"1", b"null", b'"unterminated', b""):
        assert template.text(head + middle + tail) is None  # not one string: decoded in full (or refused) as before


def test_a_text_found_elsewhere_in_the_chunk_is_not_taken_for_the_chunks_text() -> None:
    # The delta's "é" escaped, as Python's json writes it, and the same text unescaped in an extra nested field:
    # orjson's form of the text occurs once, in the wrong place. The probe shows it, so nothing is learned.
    body = chunk("é")
    data = json.dumps(body).encode().replace(b'"model": "m"', '"x": {"content": "é"}'.encode(), 1)
    template = ChunkTemplate(plain_delta)
    template.learn(data, json.loads(data))
    assert template.head is None
    later = frames([chunk("é"), chunk("é")], python_style).replace(b'"model": "m"', '"x": {"content": "é"}'.encode())
    assert events_of(later, 100_000, ChunkTemplate(plain_delta)) == events_of(later, 100_000, None)


def test_learning_gives_up_after_a_few_chunks_that_do_not_fit() -> None:
    template = ChunkTemplate(plain_delta)
    for i in range(5):  # each chunk holds its text twice (as its id too): no single place to cut at
        data = orjson_style(chunk(f"t{i}", chunk_id=f"t{i}"))
        if template.learning:
            template.learn(data, orjson.loads(data))
    assert template.head is None and not template.learning


def learned() -> ChunkTemplate:
    template = ChunkTemplate(plain_delta)
    first = orjson_style(chunk("a"))
    template.learn(first, orjson.loads(first))
    assert template.head is not None
    return template


def test_a_run_of_learned_chunks_is_read_at_once_with_the_strings_as_sent() -> None:
    template = learned()
    head, tail = template.head, template.tail
    middles = [b'"x"', b'"\\u00e9\\n"', b'""', b' "spaced" ', b'"\\ud83d\\ude00"']
    found = template.run([head + middle + tail for middle in middles])  # type: ignore[operator]
    kept = [b'"x"', b'"\\u00e9\\n"', b' "spaced" ', b'"\\ud83d\\ude00"']  # the empty text is left out
    assert found == (["x", "é\n", "spaced", "😀"], kept)


@pytest.mark.parametrize(
    "middles",
    [
        [b'"a","b', b'c"'],  # two strings only across the cut: a raw line feed is never inside one
        [b'["a"', b'"b"]'],  # one value spanning two middles
        [b'"a","b"', b'"c"'],  # one middle holding two strings
        [b'"a"', b""],  # nothing between the ends
        [b'"a"', b"1"],
        [b'"a"', b"null"],
        [b'"a"]', b'["b"'],
        [b'"a"', b'"\\ud800"'],  # a lone surrogate: orjson refuses it, as it refuses it alone
        [b'"a"', b'"\xff"'],  # not UTF-8
        [b'"a"', b'"tab\tin"'],  # a raw control character
    ],
)
def test_a_run_whose_middles_are_not_one_string_each_is_refused(middles: list[bytes]) -> None:
    template = learned()
    assert template.run([template.head + middle + template.tail for middle in middles]) is None  # type: ignore[operator]


def test_a_refused_run_is_read_chunk_by_chunk_as_before() -> None:
    body = orjson_style(chunk("x"))
    template, plain = learned(), ChunkTemplate(plain_delta)
    head, tail = template.head, template.tail
    spanning = b"".join(b"data: " + head + m + tail + b"\n\n" for m in (b'"a","b', b'c"'))  # type: ignore[operator]
    stream = b"data: " + body + b"\n\n" + spanning + b"data: [DONE]\n\n"
    with pytest.raises(Exception) as by_template:
        events_of(stream, 100_000, template)
    with pytest.raises(Exception) as in_full:
        events_of(stream, 100_000, plain)
    assert type(by_template.value) is type(in_full.value)  # the same judgement: not a chunk of any shape
    assert str(by_template.value) == str(in_full.value)


def test_a_long_integer_after_the_template_is_learned_is_still_read_exactly() -> None:
    # Events come from the decoder unchecked for long digit runs; each one decoded in full is checked alone.
    big = 2**70 + 1
    seeded = chunk("c")
    seeded["choices"][0]["delta"]["seed"] = big  # a field of the delta the events carry on (`DeltaFields`)
    stream = frames([chunk(None), chunk("a"), chunk("b"), seeded, chunk("d")], python_style)
    assert f'"seed": {big}'.encode() in stream
    events = events_of(stream, 100_000, ChunkTemplate(plain_delta))
    seeds = [event.fields["seed"] for event in events if isinstance(event, DeltaFields)]
    assert seeds == [big] and type(seeds[0]) is int
    assert events == events_of(stream, 100_000, None)
