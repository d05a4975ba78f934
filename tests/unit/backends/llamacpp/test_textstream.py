"""Stop strings and logprob alignment in the token → text stream (no model needed)."""

from __future__ import annotations

from tokenrelay.backends.base import TokenLogprob
from tokenrelay.backends.llamacpp.textstream import TextStream


def entry(token: str) -> TokenLogprob:
    return TokenLogprob(token=token, logprob=-1.0, bytes=list(token.encode()), top=[])


def feed_all(stream: TextStream, pieces: list[str]) -> tuple[str, list[str], bool]:
    text, tokens, stopped = "", [], False
    for piece in pieces:
        out = stream.feed(piece.encode(), entry(piece))
        text += out.text
        tokens += [e.token for e in out.logprobs]
        if out.stopped:
            return text, tokens, True
    out = stream.flush()
    return text + out.text, tokens + [e.token for e in out.logprobs], stopped


def test_stop_split_across_tokens_is_caught_and_never_released() -> None:
    stream = TextStream(["END"])
    released = []
    for piece in ["Hello E", "N", "D tail"]:
        out = stream.feed(piece.encode(), entry(piece))
        released.append(out.text)
        if out.stopped:
            break
    assert "".join(released) == "Hello "
    assert all("E" not in r for r in released)  # the partial stop was held back, not streamed
    assert out.stopped


def test_text_that_only_looks_like_a_stop_prefix_is_released_later() -> None:
    text, tokens, stopped = feed_all(TextStream(["END"]), ["a E", "x", "b"])
    assert text == "a Exb"
    assert tokens == ["a E", "x", "b"]
    assert not stopped


def test_logprobs_after_stop_are_dropped_and_offsets_count_characters() -> None:
    stream = TextStream(["\n\n"], offset=10)
    outs = [stream.feed(p.encode(), entry(p)) for p in ["ab", "c\n", "\nzz"]]
    assert "".join(o.text for o in outs) == "abc"
    tokens = [e for o in outs for e in o.logprobs]
    assert [e.token for e in tokens] == ["ab", "c\n"]
    assert [e.text_offset for e in tokens] == [10, 12]
    assert outs[-1].stopped


def test_multibyte_character_split_over_tokens() -> None:
    stream = TextStream([])
    snowman = "☃".encode()
    first = stream.feed(snowman[:1], entry("x"))
    second = stream.feed(snowman[1:], entry("y"))
    assert first.text == "" and second.text == "☃"
    assert [e.token for e in first.logprobs + second.logprobs] == ["x", "y"]


def test_earliest_of_several_stops_wins() -> None:
    text, _, stopped = feed_all(TextStream(["zz", "b"]), ["aaa bzz"])
    assert text == "aaa " and stopped


def test_the_stop_that_matched_is_reported_the_earliest_one_first() -> None:
    stream = TextStream(["tail", "lo", "Hel"])
    out = stream.feed(b"Hello tail")
    assert (out.text, out.stopped, out.stop) == ("", True, "Hel")
    later = TextStream(["tail", "o w"])
    first = later.feed(b"Hello wor")
    assert (first.text, first.stopped, first.stop) == ("Hell", True, "o w")


def test_no_stop_is_reported_when_none_matched() -> None:
    stream = TextStream(["END"])
    assert stream.feed(b"Hello").stop is None
    assert stream.flush().stop is None
