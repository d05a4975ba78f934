"""Ollama's `keep_alive` durations, in the config and in requests."""

from __future__ import annotations

import re
from typing import Annotated, Any

from pydantic import BeforeValidator

_DURATION = re.compile(r"^(-?\d+(?:\.\d+)?)(ms|s|m|h)?$")
_DURATION_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, None: 1.0}


def parse_keep_alive(value: Any) -> Any:
    """Ollama's `keep_alive`: seconds, or a duration such as "30s", "5m", "1h"; 0 unloads at once, a negative one
    never. Returned as seconds (negative: never)."""
    if isinstance(value, str):
        match = _DURATION.match(value.strip())
        if match is None:
            raise ValueError('write a number of seconds or a duration such as "30s", "5m" or "1h" (-1: never)')
        return float(match.group(1)) * _DURATION_UNITS[match.group(2)]
    return value


KeepAlive = Annotated[float, BeforeValidator(parse_keep_alive)]
