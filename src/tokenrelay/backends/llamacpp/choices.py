"""A request's prompts and choices: how the scheduler's events of each prompt become the client's choices,
and how `best_of` candidates are held back and ranked."""

from __future__ import annotations

from dataclasses import dataclass, field

from tokenrelay.backends.base import Event, Finish, TextDelta, Usage
from tokenrelay.backends.llamacpp.jobs import Job, JobDone, SeqFinished


@dataclass
class PromptRun:
    """One prompt of a request: its tokens, how its choices are numbered, what is echoed."""

    tokens: list[int]
    first_index: int
    echo_text: str | None = None
    echo_from: int = 0


@dataclass
class Candidate:
    """A best_of candidate kept back until all are done, then ranked by mean token logprob."""

    events: list[TextDelta] = field(default_factory=list)
    finish: str | None = None
    stop: str | None = None
    score: float = float("-inf")


def partial_usage(jobs: list[Job]) -> Usage:
    """What a request cut short had consumed: its prompts and the tokens generated so far."""
    return Usage(
        prompt_tokens=sum(len(job.prompt) for job in jobs),
        completion_tokens=sum(job.completion_tokens for job in jobs),
        cached_tokens=sum(job.cached_tokens for job in jobs),
    )


def translate(event: object, run: PromptRun, pool: dict[int, Candidate], ranked: bool, n: int) -> list[Event]:
    """Scheduler events of one prompt → client events, renumbered; best_of candidates are held back."""
    if isinstance(event, TextDelta):
        if ranked:
            pool.setdefault(event.index, Candidate()).events.append(event)
            return []
        return [TextDelta(run.first_index + event.index, event.text, event.logprobs)]
    if isinstance(event, SeqFinished):
        if ranked:
            candidate = pool.setdefault(event.index, Candidate())
            candidate.finish, candidate.stop = event.reason, event.stop
            candidate.score = event.mean_logprob if event.mean_logprob is not None else float("-inf")
            return []
        return [Finish(run.first_index + event.index, event.reason, event.stop)]
    if isinstance(event, JobDone) and ranked:
        return best_candidates(pool, run, n)
    return []


def best_candidates(pool: dict[int, Candidate], run: PromptRun, n: int) -> list[Event]:
    """The `n` candidates with the highest mean token logprob, renumbered as choices."""
    order = sorted(pool, key=lambda i: (-pool[i].score, i))[:n]
    out: list[Event] = []
    for choice, index in enumerate(order):
        for event in pool[index].events:
            out.append(TextDelta(run.first_index + choice, event.text, event.logprobs))
        out.append(Finish(run.first_index + choice, pool[index].finish or "stop", pool[index].stop))
    return out
