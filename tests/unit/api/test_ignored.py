"""The header that names the request fields accepted without effect."""

from __future__ import annotations

import h11

from tokenrelay.api.ignored import ignored_header


def test_every_name_is_written_so_that_a_header_can_carry_it() -> None:
    name, value = ignored_header(["b", "a", "a", "Ü\x1ex\n", 'q"'])
    assert value == b'a, b, q\\", \\u00dc\\u001ex\\n'
    # What an HTTP/1.1 server sends: a value with control characters in it would be refused here.
    h11.Response(status_code=200, headers=[(name, value)])
