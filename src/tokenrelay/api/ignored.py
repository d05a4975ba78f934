"""Request fields accepted without effect are named in the response, so nothing a client sent is dropped silently."""

from __future__ import annotations

from collections.abc import Iterable

IGNORED_FIELDS = b"x-tokenrelay-ignored-fields"


def ignored_header(names: Iterable[str]) -> tuple[bytes, bytes]:
    """The header naming `names`, comma-separated (a name that is not ASCII is written with backslash escapes)."""
    return IGNORED_FIELDS, ", ".join(sorted(set(names))).encode("ascii", "backslashreplace")
