"""The SSE decoder: events out of byte chunks split anywhere, whatever the line endings."""

from __future__ import annotations

import pytest

from tokenrelay.backends.upstream.sse_parse import SSEDecoder, SSEMessage

STREAM = 'data: {"a": "é"}\n\n: keep-alive\n\nevent: error\ndata: line one\ndata: line two\n\ndata: [DONE]\n\n'.encode()
EXPECTED = [SSEMessage('{"a": "é"}'), SSEMessage("line one\nline two", "error"), SSEMessage("[DONE]")]


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
    assert decode([b"data: x\r", b"\n\r", b"\ndata: y\r\n\r\n"]) == [SSEMessage("x"), SSEMessage("y")]


def test_comments_and_blank_lines_alone_yield_nothing() -> None:
    assert decode([b": ping\n\n\n\n: ping\n\n"]) == []


def test_an_unterminated_last_event_is_still_delivered_at_the_end() -> None:
    decoder = SSEDecoder()
    assert decoder.feed(b'data: {"last": true}') == []
    assert decoder.close() == [SSEMessage('{"last": true}')]


def test_field_without_space_and_unknown_fields() -> None:
    assert decode([b"id: 7\nretry: 10\ndata:tight\n\n"]) == [SSEMessage("tight")]


MIXED = (
    b'data: {"n": 1}\n\n: keep-alive\n\n\n\ndata:tight\n\nevent: error\ndata: one\ndata: two\n\n'
    b'data: \xff\xfe broken\n\nid: 3\ndata: after id\n\ndata: {"\xc3\xa9": 2}\n\ndata: [DONE]\n\n'
)


def line_by_line(chunks: list[bytes]) -> list[SSEMessage]:
    """The reference: every byte through the line-by-line reader."""
    decoder = SSEDecoder()
    out = [message for chunk in chunks for message in decoder._feed_lines(decoder._pending + chunk)]
    return out + decoder.close()


@pytest.mark.parametrize("size", [1, 2, 3, 7, 16, 40, 1000])
def test_the_block_reader_gives_what_the_line_reader_gives(size: int) -> None:
    chunks = [MIXED[i : i + size] for i in range(0, len(MIXED), size)]
    got, expected = decode(chunks), line_by_line(chunks)
    assert got == expected
    assert [m.data for m in got][:3] == ['{"n": 1}', "tight", "one\ntwo"]
    assert "\ufffd" in got[3].data  # invalid UTF-8 read with replacement characters either way


def test_whole_data_lines_keep_their_bytes_for_json_decoding() -> None:
    messages = decode([MIXED])
    raw = {m.data: m.raw for m in messages}
    assert raw['{"n": 1}'] == b'{"n": 1}' and raw['{"é": 2}'] == '{"é": 2}'.encode()
    assert raw["one\ntwo"] is None  # several lines: read line by line
    assert next(m for m in messages if "\ufffd" in m.data).raw is None  # not UTF-8: no bytes passed on


def test_no_bytes_are_passed_on_from_a_read_holding_a_long_digit_run() -> None:
    # orjson reads 19 digits and more as a float: such a read's chunks go through the checked decoding
    long_run = b'data: {"seed": 12345678901234567890}\n\ndata: {"n": 1}\n\n'
    assert [m.raw for m in decode([long_run])] == [None, None]
    split_run = [b'data: {"n": 1}\n\ndata: {"seed": 1234567890', b"1234567890}\n\n"]  # across two reads
    messages = decode(split_run)
    assert messages[0].raw == b'{"n": 1}' and messages[1].raw is None
