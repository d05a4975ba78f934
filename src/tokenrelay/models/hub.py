"""GGUF models pulled from the Hugging Face Hub through `huggingface_hub`.

The library's own settings apply unchanged: its cache (HF_HOME, HF_HUB_CACHE), token (HF_TOKEN), endpoint
(HF_ENDPOINT), offline mode (HF_HUB_OFFLINE) and progress bars; a file already in the cache is never fetched again.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Iterable
from pathlib import Path

from huggingface_hub import HfApi, constants, hf_hub_download, scan_cache_dir
from huggingface_hub.errors import (
    CacheNotFound,
    LocalEntryNotFoundError,
    OfflineModeIsEnabled,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)

from tokenrelay.models.source import HubSource, parse_source

log = logging.getLogger(__name__)

# Tried in this order when the source names no quantisation: the usual balance of size and quality first.
PREFERRED_TAGS = ("Q4_K_M", "Q4_0", "Q8_0")
_SPLIT = re.compile(r"(?P<stem>.+)-(?P<part>\d{5})-of-(?P<count>\d{5})\.gguf", re.IGNORECASE)


class HubError(RuntimeError):
    """A model from the Hub that cannot be had; the message names the source and what to do about it."""


class HubUnavailable(HubError):
    """The Hub cannot be reached (or HF_HUB_OFFLINE is set) and the cache does not hold the model."""


class NotOnHub(HubError):
    """The Hub answered: no such repository, or no GGUF file in it matches the source."""


def model_file(source: str) -> Path:
    """The local path of the source's GGUF (a split one's first part, with every part beside it), downloaded
    into the Hub cache when missing; what the cache holds when the Hub cannot be reached."""
    hub = parse_source(source)
    try:
        # model_info, not list_repo_files: one request that the library does not retry, so an unreachable Hub
        # sends us to the cache at once rather than after half a minute of backoff.
        names = [sibling.rfilename for sibling in HfApi().model_info(hub.repo_id).siblings or []]
    except (RepositoryNotFoundError, RevisionNotFoundError) as exc:
        missing = f"{hub.text}: the Hub has no model repository {hub.repo_id!r} (a private or gated one needs HF_TOKEN)"
        return _from_cache(hub, NotOnHub(missing), exc)
    except Exception as exc:  # the Hub out of reach: each library version raises its own HTTP client's errors
        return _from_cache(hub, _unavailable(hub, exc), exc)
    return _download(hub, choose_files(hub, names))


def chat_template_from_repo(source: str) -> str | None:
    """The `chat_template` of the repo's tokenizer_config.json (a list's "default" entry), or None when the repo
    has none or it cannot be fetched: the GGUF's own template is preferred to it anyway."""
    hub = parse_source(source)
    try:
        config = json.loads(Path(hf_hub_download(hub.repo_id, "tokenizer_config.json")).read_text(encoding="utf-8"))
    except Exception as exc:  # no such file, the Hub out of reach or a malformed file: a built-in template serves
        log.info("%s: no chat template from its tokenizer_config.json (%s)", hub.text, _reason(exc))
        return None
    return template_in(config)


def template_in(config: object) -> str | None:
    """A tokenizer config's chat template: a string, or the "default" one of a list of {name, template}."""
    template = config.get("chat_template") if isinstance(config, dict) else None
    if isinstance(template, list):
        named = (entry for entry in template if isinstance(entry, dict) and entry.get("name") == "default")
        template = next((entry.get("template") for entry in named), None)
    return template if isinstance(template, str) and template else None


def choose_files(hub: HubSource, names: Iterable[str]) -> list[str]:
    """The repo files to fetch for `hub`: one GGUF, or every part of a split one in order (its first part first).

    The source's tag or exact file if it names one; else Q4_K_M, Q4_0, Q8_0, then the first GGUF by name.
    A multimodal projector (`mmproj`) is never a model of its own.
    """
    models = gguf_models(names)
    if not models:
        raise NotOnHub(f"{hub.text}: the repository holds no GGUF model file")
    if hub.file is not None:
        chosen = next((first for first, parts in models.items() if hub.file in parts), None)
        wanted = f"no GGUF model file {hub.file!r}"
    elif hub.tag is not None:
        chosen = _tagged(models, hub.tag)
        wanted = f"no GGUF file matching {hub.tag!r}"
    else:
        tagged = (_tagged(models, tag) for tag in PREFERRED_TAGS)
        chosen = next((first for first in tagged if first is not None), min(models))
        wanted = ""
    if chosen is None:
        raise NotOnHub(f"{hub.text}: the repository has {wanted}; its GGUF files: {', '.join(models)}")
    return models[chosen]


def gguf_models(names: Iterable[str]) -> dict[str, list[str]]:
    """Each GGUF model among a repo's files, by name order: its first file -> all its files (a split GGUF's
    parts, complete sets only)."""
    sets: dict[str, list[str]] = {}
    for name in sorted(names):
        base = name.rsplit("/", 1)[-1].lower()
        if base.endswith(".gguf") and "mmproj" not in base:
            split = _SPLIT.fullmatch(name)
            sets.setdefault(f"{split['stem']}-of-{split['count']}" if split else name, []).append(name)
    return {parts[0]: parts for parts in sets.values() if _complete(parts)}


def _complete(parts: list[str]) -> bool:
    split = _SPLIT.fullmatch(parts[0])
    if split is None:
        return True
    numbers = [int(match["part"]) for part in parts if (match := _SPLIT.fullmatch(part)) is not None]
    return numbers == list(range(1, int(split["count"]) + 1))


def _tagged(models: dict[str, list[str]], tag: str) -> str | None:
    # A whole tag only: Q4_K matches neither Q4_K_M nor IQ4_K.
    pattern = re.compile(rf"(?<![A-Za-z0-9]){re.escape(tag)}(?![A-Za-z0-9]|_[A-Za-z0-9])", re.IGNORECASE)
    return next((first for first in models if pattern.search(first)), None)


def _download(hub: HubSource, files: list[str]) -> Path:
    paths = []
    for name in files:
        try:
            paths.append(Path(hf_hub_download(hub.repo_id, name)))
        except LocalEntryNotFoundError as exc:  # the Hub stopped answering after listing the repo
            raise _unavailable(hub, exc) from exc
        except Exception as exc:  # the library's own retries are spent: one line for the caller
            raise HubError(f"{hub.text}: downloading {name} failed ({_reason(exc)})") from exc
    return paths[0]


def _from_cache(hub: HubSource, error: HubError, cause: Exception) -> Path:
    """The source's GGUF as the cache holds it (the files of the revision `main` last resolved to), else `error`."""
    cached = _cached_files(hub.repo_id)
    try:
        files = choose_files(hub, cached)
    except NotOnHub:
        raise error from cause
    log.info("%s: served from the Hugging Face cache (%s)", hub.text, _reason(cause))
    return cached[files[0]]


def _cached_files(repo_id: str) -> dict[str, Path]:
    try:
        cache = scan_cache_dir(constants.HF_HUB_CACHE)  # the folder hf_hub_download fills
    except CacheNotFound:
        return {}
    for repo in cache.repos:
        if repo.repo_type == "model" and repo.repo_id == repo_id:
            for revision in repo.revisions:
                if "main" in revision.refs:
                    root = revision.snapshot_path
                    return {f.file_path.relative_to(root).as_posix(): f.file_path for f in revision.files}
    return {}


def _unavailable(hub: HubSource, exc: Exception) -> HubUnavailable:
    reason = "HF_HUB_OFFLINE is set" if isinstance(exc, OfflineModeIsEnabled) else _reason(exc)
    return HubUnavailable(
        f"{hub.text}: the Hugging Face Hub cannot be reached ({reason}) and its cache holds no matching GGUF; "
        f"run `tokenrelay pull {hub.text}` where the Hub is reachable"
    )


def _reason(exc: Exception) -> str:
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0]}" if lines else type(exc).__name__
