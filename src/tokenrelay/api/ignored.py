"""Request fields accepted without effect are named in the response, so nothing a client sent is dropped silently."""

from __future__ import annotations

import json
from collections.abc import Iterable

IGNORED_FIELDS = b"x-tokenrelay-ignored-fields"


def ignored_header(names: Iterable[str]) -> tuple[bytes, bytes]:
    """The header naming `names`, comma-separated; a name's characters that a header cannot hold (control
    characters, anything beyond ASCII) are written as JSON escapes."""
    return IGNORED_FIELDS, ", ".join(json.dumps(name)[1:-1] for name in sorted(set(names))).encode("ascii")
