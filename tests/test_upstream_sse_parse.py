"""The SSE decoder: events out of byte chunks split anywhere, whatever the line endings."""

from __future__ import annotations

import pytest

from tokenrelay.backends.upstream.sse_parse import Event, SSEDecoder, SSEMessage

STREAM = 'data: {"a": "é"}\n\n: keep-alive\n\nevent: error\ndata: line one\ndata: line two\n\ndata: [DONE]\n\n'.encode()
EXPECTED = [SSEMessage('{"a": "é"}'), SSEMessage("line one\nline two", "error"), SSEMessage("[DONE]")]


def decode_as_given(chunks: list[bytes]) -> list[Event]:
    decoder = SSEDecoder()
    out = [message for chunk in chunks for message in decoder.feed(chunk)]
    return out + decoder.close()


def read(event: Event) -> SSEMessage:
    """An event as its message: a plain data event's bytes read as the line-by-line reader reads them."""
    return SSEMessage(event.decode("utf-8", errors="replace")) if isinstance(event, bytes) else event


def decode(chunks: list[bytes]) -> list[SSEMessage]:
    return [read(event) for event in decode_as_given(chunks)]


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


def test_plain_data_events_come_as_their_bytes_for_json_decoding() -> None:
    events = decode_as_given([MIXED])
    assert events[0] == b'{"n": 1}' and '{"é": 2}'.encode() in events
    assert SSEMessage("one\ntwo", "error") in events  # several lines: read line by line
    assert b"\xff\xfe broken" in events  # not UTF-8: passed on as it came, for the reader to judge
    whole = b'data: {"a": 1}\n\ndata: {"b": 2}\n\ndata: [DONE]\n\n'
    assert decode_as_given([whole]) == [b'{"a": 1}', b'{"b": 2}', b"[DONE]"]  # one split for the whole read


def test_plain_data_events_come_as_bytes_whatever_numbers_they_hold() -> None:
    # orjson reads 19 digits and more as a float: the relay checks each event it decodes in full, not the decoder
    # every read (`test_upstream_relay`'s long-integer test reads them exactly, whole or split inside the digits)
    long_run = b'data: {"seed": 12345678901234567890}\n\ndata: {"n": 1}\n\n'
    assert decode_as_given([long_run]) == [b'{"seed": 12345678901234567890}', b'{"n": 1}']
    split_run = [b'data: {"n": 1}\n\ndata: {"seed": 1234567890', b"1234567890}\n\n"]  # across two reads
    assert decode_as_given(split_run) == [b'{"n": 1}', b'{"seed": 12345678901234567890}']
