"""Chat templates: the GGUF's own Jinja template rendered as Hugging Face does, a built-in one, or a file."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from importlib.resources import files
from pathlib import Path
from typing import Any

from jinja2 import TemplateError, meta
from jinja2.sandbox import ImmutableSandboxedEnvironment

from tokenrelay.backends.llamacpp.thinking import thinks
from tokenrelay.errors import InvalidRequest

log = logging.getLogger(__name__)

# GGUF `general.architecture` prefixes → built-in template file (tokenrelay/templates/NAME.jinja).
FAMILY_TEMPLATES = {"gemma": "gemma", "llama": "llama3", "qwen": "chatml"}


def builtin_template(name: str) -> str:
    return files("tokenrelay").joinpath("templates", f"{name}.jinja").read_text()


def template_for(
    architecture: str, embedded: str | None, override: Path | None, repo: Callable[[], str | None] | None = None
) -> tuple[str, str]:
    """Pick the template source and say where it came from: a file, the GGUF, the model's repository (asked only
    when the GGUF has none), a family default, ChatML."""
    if override is not None:
        return override.read_text(), f"file {override}"
    if embedded:
        return embedded, "gguf"
    if repo is not None and (from_repo := repo()):
        return from_repo, "repository tokenizer_config.json"
    for prefix, name in FAMILY_TEMPLATES.items():
        if architecture.startswith(prefix):
            return builtin_template(name), f"built-in {name}"
    log.warning("model architecture %r has no chat template; falling back to ChatML", architecture)
    return builtin_template("chatml"), "built-in chatml"


def _raise_exception(message: str) -> None:
    raise TemplateError(message)


def _tojson(value: Any, indent: int | None = None, ensure_ascii: bool = False) -> str:
    return json.dumps(value, indent=indent, ensure_ascii=ensure_ascii)


@dataclass
class ChatTemplate:
    """A compiled chat template plus the special tokens templates expect as variables."""

    source: str
    origin: str
    bos_token: str
    eos_token: str
    takes_tools: bool = field(init=False)  # the template reads a `tools` variable: it renders tools itself
    thinks: bool = field(init=False)  # the template has a thinking section (`thinking.py`)

    def __post_init__(self) -> None:
        # Same environment options as transformers' `apply_chat_template`, so GGUF templates written for it
        # render identically here.
        env = ImmutableSandboxedEnvironment(
            trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"]
        )
        env.filters["tojson"] = _tojson
        env.globals["raise_exception"] = _raise_exception
        env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
        self._template = env.from_string(self.source)
        self.takes_tools = "tools" in meta.find_undeclared_variables(env.parse(self.source))
        self.thinks = thinks(self.source)

    def render(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None = None,
        *,
        continued: bool = False,
        opened: bool = True,
    ) -> str:
        """The prompt: the messages and a new assistant turn opened (unless not `opened`: the conversation alone),
        or with `continued` the last message (an assistant's) left open, so that the model writes on from its text
        (vLLM's `continue_final_message`)."""
        if continued and not messages[-1].get("content"):
            messages, continued = messages[:-1], False  # nothing written yet: the answer starts afresh
        if not continued:
            return self._render(messages, tools, add_generation_prompt=opened)
        # The last message is rendered as a marker, so that its place is found whatever the template does
        # around it (searching for the text itself could find it inside the turn's closing tokens).
        last = messages[-1]["content"]
        text = self._render([*messages[:-1], {**messages[-1], "content": _MARKER}], tools, add_generation_prompt=False)
        end = text.rfind(_MARKER)
        if end < 0:
            raise InvalidRequest(
                "This model's chat template does not show the last message, so it cannot be continued.",
                param="continue_final_message",
            )
        return text[:end] + last

    def _render(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None, **flags: bool) -> str:
        try:
            return self._template.render(
                messages=messages, tools=tools, bos_token=self.bos_token, eos_token=self.eos_token, **flags
            )
        except TemplateError as exc:
            raise InvalidRequest(f"The model's chat template rejected the messages: {exc}", param="messages") from exc


# Stands in for a message being continued: text no message holds, that templates keep as it is (no whitespace
# at its ends to trim, nothing to escape).
_MARKER = "tokenrelay-continues-here-7f3a9c"
