"""A batch file's line stays one line for every reader, whatever characters a model wrote."""

from __future__ import annotations

import json

from tokenrelay.openai.batches.runner import jsonl_line


def test_a_models_line_and_paragraph_separators_never_split_a_line() -> None:
    row = {"custom_id": "c1", "content": "one\u2028two\x85three\u2029four\nfive\x0bsix\x1cseven é 中"}
    line = jsonl_line(row)
    text = line.decode()
    assert text.endswith("\n") and len(text.splitlines()) == 1 and text.count("\n") == 1
    assert json.loads(text) == row
