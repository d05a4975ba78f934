"""The SSE decoder: events out of byte chunks split anywhere, whatever the line endings."""

from __future__ import annotations

import pytest

from tokenrelay.backends.upstream.sse_parse import SSEDecoder, SSEMessage

STREAM = 'data: {"a": "é"}\n\n: keep-alive\n\nevent: error\ndata: line one\ndata: line two\n\ndata: [DONE]\n\n'.encode()
EXPECTED = [
    SSEMessage('{"a": "é"}'.encode()),
    SSEMessage(b"line one\nline two", "error"),
    SSEMessage(b"[DONE]"),
]


def decode(chunks: list[bytes]) -> list[SSEMessage]:
    decoder = SSEDecoder()
    out = [message for chunk in chunks for message in decoder.feed(chunk)]
    return out + decoder.close()


@pytest.mark.parametrize("size", [1, 2, 3, 5, 8, 13, 1000])
@pytest.mark.parametrize("newline", [b"\n", b"\r\n", b"\r"])
def test_events_survive_any_split_and_line_ending(size: int, newline: bytes) -> None:
    data = STREAM.replace(b"\n", newline)
    assert decode([data[i : i + size] for i in range(0, len(data), size)]) == EXPECTED


def test_a_crlf_split_between_chunks_is_one_line_ending() -> None:
    assert decode([b"data: x\r", b"\n\r", b"\ndata: y\r\n\r\n"]) == [SSEMessage(b"x"), SSEMessage(b"y")]


def test_comments_and_blank_lines_alone_yield_nothing() -> None:
    assert decode([b": ping\n\n\n\n: ping\n\n"]) == []


def test_an_unterminated_last_event_is_still_delivered_at_the_end() -> None:
    decoder = SSEDecoder()
    assert decoder.feed(b'data: {"last": true}') == []
    assert decoder.close() == [SSEMessage(b'{"last": true}')]


def test_field_without_space_and_unknown_fields() -> None:
    assert decode([b"id: 7\nretry: 10\ndata:tight\n\n"]) == [SSEMessage(b"tight")]


MIXED = (
    b'data: {"n": 1}\n\n: keep-alive\n\n\n\ndata:tight\n\nevent: error\ndata: one\ndata: two\n\n'
    b'data: \xff\xfe broken\n\nid: 3\ndata: after id\n\ndata: {"\xc3\xa9": 2}\n\ndata: [DONE]\n\n'
)


@pytest.mark.parametrize("size", [1, 2, 3, 7, 16, 40, 1000])
def test_a_mixed_stream_split_anywhere_gives_its_events(size: int) -> None:
    got = decode([MIXED[i : i + size] for i in range(0, len(MIXED), size)])
    assert got == [
        SSEMessage(b'{"n": 1}'),
        SSEMessage(b"tight"),
        SSEMessage(b"one\ntwo", "error"),
        SSEMessage(b"\xff\xfe broken"),  # not UTF-8: kept as sent, for the reader to judge
        SSEMessage(b"after id"),
        SSEMessage('{"é": 2}'.encode()),
        SSEMessage(b"[DONE]"),
    ]


def test_a_character_split_between_chunks_is_read_whole() -> None:
    data = 'data: "é✓🦊"\n\n'.encode()
    for cut in range(7, 17):
        [message] = decode([data[:cut], data[cut:]])
        assert message.json() == "é✓🦊"


def test_a_payload_that_is_not_utf8_reads_with_replacement_characters() -> None:
    # As the SSE standard decodes a stream: the JSON stays readable, the bad bytes become U+FFFD.
    [message] = decode([b'data: {"text": "caf\xe9 \xff"}\n\n'])
    assert message.json() == {"text": "caf\ufffd \ufffd"}
