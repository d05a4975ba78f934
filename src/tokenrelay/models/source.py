"""Where a GGUF comes from, written `hf:org/repo[:TAG|:FILE]`: parsed and checked without touching the network.

Kept apart from `hub.py` so that loading the settings (which checks every model's source) does not import
`huggingface_hub` and its HTTP client.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

PREFIX = "hf:"
# The Hub's repo names: letters, digits, `-`, `_`, `.`, at most 96 characters, no `--` or `..`.
_NAME = r"[A-Za-z0-9_](?:[A-Za-z0-9_.-]{0,94}[A-Za-z0-9_])?"
_REPO_ID = re.compile(rf"{_NAME}/{_NAME}")
_TAG = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")
_FILE = re.compile(r"[^:\\]+\.gguf", re.IGNORECASE)
FORM = "hf:org/repo, hf:org/repo:QUANT (e.g. Q4_K_M) or hf:org/repo:FILE.gguf"


@dataclass(frozen=True, slots=True)
class HubSource:
    """A model repository on the Hugging Face Hub, and which of its GGUF files to serve."""

    text: str  # as written, for messages
    repo_id: str
    tag: str | None = None  # a quantisation, matched case-insensitively against the repo's file names
    file: str | None = None  # an exact file path in the repo


def is_hub_source(text: str) -> bool:
    return text.startswith(PREFIX)


def default_model_id(text: str) -> str:
    """The id a model from this source is served under unless one is given: the repo's name, lowercased.
    Never fails: a malformed source is reported where the settings are checked."""
    return text.removeprefix(PREFIX).partition(":")[0].rsplit("/", 1)[-1].lower()


def parse_source(text: str) -> HubSource:
    """`hf:org/repo`, `hf:org/repo:Q4_K_M` or `hf:org/repo:some-file.gguf`; ValueError saying what is wrong."""
    if not is_hub_source(text):
        raise ValueError(f"model source {text!r} does not start with {PREFIX!r}; write {FORM}")
    repo_id, _, selector = text.removeprefix(PREFIX).partition(":")
    if not _REPO_ID.fullmatch(repo_id) or "--" in repo_id or ".." in repo_id:
        raise ValueError(f"model source {text!r}: {repo_id!r} is not a Hub repository id (org/repo); write {FORM}")
    if not selector:
        if text.endswith(":"):
            raise ValueError(f"model source {text!r} ends with ':' but names no quantisation or file; write {FORM}")
        return HubSource(text, repo_id)
    if selector.lower().endswith(".gguf"):
        if not _FILE.fullmatch(selector) or selector.startswith("/") or ".." in selector.split("/"):
            raise ValueError(f"model source {text!r}: {selector!r} is not a file path inside the repository")
        return HubSource(text, repo_id, file=selector)
    if not _TAG.fullmatch(selector):
        raise ValueError(f"model source {text!r}: {selector!r} is neither a quantisation tag nor a .gguf file name")
    return HubSource(text, repo_id, tag=selector)
