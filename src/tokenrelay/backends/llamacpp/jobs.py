"""What the engine hands the scheduler: a prompt and the sequences (choices) to generate from it."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field

from tokenrelay.backends.base import TokenLogprob
from tokenrelay.backends.llamacpp.sampling import SamplingParams
from tokenrelay.backends.llamacpp.structured.constraint import GrammarConstraint


@dataclass(frozen=True, slots=True)
class SeqPlan:
    """One candidate sequence of a job."""

    index: int
    params: SamplingParams
    max_tokens: int
    stops: list[str]
    text_offset: int = 0  # where generated text starts in the choice's text (after an echoed prompt)
    constraint: GrammarConstraint | None = None  # this sequence's own grammar state (structured output)


@dataclass(slots=True)
class PromptScored:
    """Logprobs of the prompt's tokens (for `echo` with `logprobs`); the first echoed token has none."""

    entries: list[TokenLogprob]


@dataclass(slots=True)
class SeqFinished:
    index: int
    reason: str
    mean_logprob: float | None
    stop: str | None = None  # the stop string that ended the sequence


@dataclass(slots=True)
class JobDone:
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int


@dataclass(slots=True)
class JobFailed:
    message: str
    status: int = 500


@dataclass(eq=False)
class Job:
    """A prompt evaluated once and shared (KV copy) by all its sequences."""

    prompt: list[int]
    seqs: list[SeqPlan]
    sink: Callable[[object], None]
    prompt_logprobs: int | None = None  # top-k for prompt positions when echo+logprobs, else None
    echo_from: int = 0  # first prompt position that is echoed (after a BOS the user did not send)
    background: bool = False  # batch work: runs in slots interactive requests leave, and waits while they run
    max_tokens: int | None = None  # the request's own limit on its output (None: until the slot is full)
    width: int = 0  # the cells per slot of the lanes that may run it, set by the scheduler
    cancelled: threading.Event = field(default_factory=threading.Event)
    serial: int = 0  # admission order, set by the scheduler
    cached_tokens: int = 0
    placed_ns: int = 0  # wall-clock times (ns) the job got its slot and finished its prompt, for its trace
    prompt_done_ns: int = 0
    completion_tokens: int = 0
    running: int = 0
    scored: list[TokenLogprob] = field(default_factory=list)

    def cancel(self) -> None:
        self.cancelled.set()
