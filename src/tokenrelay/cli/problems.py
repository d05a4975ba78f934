"""Settings that do not validate, as the command line reports them: one line per problem, naming where it is."""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError


def problem_lines(exc: ValidationError) -> list[str]:
    """`models.0.pricing.input: Input should be ...`, or the message alone for a problem of the whole tree
    (a fallback cycle), without pydantic's input dump and links, which bury the sentence an operator needs."""
    return [_line(error) for error in exc.errors(include_url=False)]


def _line(error: Any) -> str:
    where = ".".join(str(part) for part in error.get("loc", ()))
    message = str(error.get("msg") or "invalid value").removeprefix("Value error, ")
    return f"{where}: {message}" if where else message
