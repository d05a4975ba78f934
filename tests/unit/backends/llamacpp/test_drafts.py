"""Prompt-lookup drafts: where the guesses come from, and that checking them changes no output (on the default
Gemma model, in process), only the number of steps."""

from __future__ import annotations

import queue
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from tokenrelay.backends.base import TextDelta
from tokenrelay.backends.llamacpp.drafts import DraftCosts, Odds, lookup_draft
from tokenrelay.backends.llamacpp.jobs import Job, JobDone, SeqFinished, SeqPlan
from tokenrelay.backends.llamacpp.model import LlamaModel
from tokenrelay.backends.llamacpp.sampling import SamplingParams
from tokenrelay.backends.llamacpp.scheduler import Scheduler
from tokenrelay.config import EngineSettings

SETTINGS = EngineSettings(slots=2, ctx_per_slot=512, threads=2, prefill_chunk=64, long_slots=0)
# Text that repeats, so that the sequence's last tokens often appeared before and the guesses are often right.
CHANT = "Row, row, row your boat, gently down the stream. Merrily, merrily, merrily, merrily, life is but a dream. "


def test_the_guess_is_what_followed_the_latest_earlier_occurrence_of_the_last_tokens() -> None:
    history = [1, 2, 3, 4, 5, 9, 2, 3, 4, 6, 7, 8, 2, 3, 4]
    assert lookup_draft(history, 2) == [6, 7]  # the occurrence at 6-8, not the one at 1-3
    assert lookup_draft(history, 10) == [6, 7, 8, 2, 3, 4]  # up to the end of what is known
    assert lookup_draft(history, 0) == []
    assert lookup_draft([1, 2, 3, 4, 5, 6], 3) == []  # the last tokens never appeared before
    assert lookup_draft([7, 7, 7, 7], 2) == [7]  # an occurrence overlapping the tail itself


def costs(*seconds: float) -> DraftCosts:
    """Costs learnt from steps of 1, 2, ... rows taking `seconds` each."""
    learnt = DraftCosts(most_rows=len(seconds))
    for rows, took in enumerate(seconds, start=1):
        learnt.observe(rows, took)
    return learnt


def test_guesses_are_added_while_their_expected_saving_exceeds_their_rows_cost() -> None:
    cheap_rows = costs(0.020, 0.024, 0.028, 0.032)  # a lone sequence's step; each extra row adds a fifth
    assert cheap_rows.worth(rate=0.9, width=1, rows=1, limit=3) == 3
    assert cheap_rows.worth(rate=0.5, width=1, rows=1, limit=3) == 2  # the third would be checked one time in 8
    assert cheap_rows.worth(rate=0.1, width=1, rows=1, limit=3) == 0  # right one time in ten: not worth a row
    assert cheap_rows.worth(rate=0.9, width=1, rows=1, limit=1) == 1  # never more than were found
    dear_rows = costs(0.020, 0.040)  # an extra row costs a whole step: no guess ever pays for it
    assert dear_rows.worth(rate=0.95, width=1, rows=1, limit=1) == 0


def test_a_row_count_never_run_is_tried_and_a_sequence_starts_at_even_odds() -> None:
    assert DraftCosts(most_rows=4).worth(rate=Odds().rate, width=1, rows=1, limit=3) > 0
    assert Odds().rate == 0.5
    assert Odds(right=8, checked=8).rate > 0.85 > Odds(right=1, checked=8).rate * 4


@contextmanager
def running(model: LlamaModel, draft_tokens: int) -> Iterator[Scheduler]:
    scheduler = Scheduler(model, SETTINGS.model_copy(update={"draft_tokens": draft_tokens}))
    scheduler.start()
    try:
        yield scheduler
    finally:
        scheduler.stop()


def run(scheduler: Scheduler, prompt: list[int], params: SamplingParams, max_tokens: int) -> list[object]:
    """A job's events until it is done (the text deltas with their logprobs, the finish, the counts)."""
    events: queue.SimpleQueue[object] = queue.SimpleQueue()
    plan = SeqPlan(index=0, params=params, max_tokens=max_tokens, stops=[])
    scheduler.submit(Job(prompt, [plan], events.put))
    seen = [events.get(timeout=120)]
    while not isinstance(seen[-1], JobDone):
        seen.append(events.get(timeout=120))
    return seen


def text(events: list[object]) -> str:
    return "".join(e.text for e in events if isinstance(e, TextDelta))


GREEDY = SamplingParams(temperature=0.0, top_logprobs=2)
SEEDED = SamplingParams(temperature=0.8, seed=7, frequency_penalty=0.3, top_logprobs=2)


# Six tokens: the sequence ends with guesses still unchecked in its last step.
@pytest.mark.parametrize(
    ("params", "max_tokens"), [(GREEDY, 6), (GREEDY, 48), (SEEDED, 48)], ids=["greedy-6", "greedy-48", "seeded-48"]
)
def test_checking_guesses_changes_no_token_logprob_or_finish(
    model: LlamaModel, params: SamplingParams, max_tokens: int
) -> None:
    prompt = model.tokenize(CHANT * 3, add_special=True, parse_special=False)
    outcomes, stats = [], []
    for draft_tokens in (0, 3):
        with running(model, draft_tokens) as scheduler:
            first = run(scheduler, prompt, params, max_tokens)
            # The next turn reuses the cells the first left (drafts included): they must hold what was said.
            follow = model.tokenize(CHANT * 3 + text(first) + " Row", add_special=True, parse_special=False)
            second = run(scheduler, follow, params, 8)
            outcomes.append((first, second))
            stats.append(scheduler.stats)
    plain, drafted = outcomes
    assert drafted == plain
    assert next(e for e in plain[0] if isinstance(e, SeqFinished)).reason == "length"
    assert stats[0].drafted_tokens == 0
    assert stats[1].drafted_tokens > 0  # guesses were checked, and changed nothing
    if params is GREEDY and max_tokens > 6:
        # The chant goes on as it went: most guesses are drawn, and the same tokens took fewer steps.
        assert stats[1].accepted_drafts > stats[1].drafted_tokens / 2
        assert stats[1].steps < stats[0].steps


def test_a_step_of_many_sequences_carries_no_guesses(model: LlamaModel) -> None:
    prompt = model.tokenize(CHANT * 3, add_special=True, parse_special=False)
    with running(model, draft_tokens=1) as scheduler:  # room for one row beside a lone sequence's, none beside two
        events: queue.SimpleQueue[object] = queue.SimpleQueue()
        plans = [SeqPlan(index=i, params=GREEDY, max_tokens=24, stops=[]) for i in range(2)]
        scheduler.submit(Job(prompt, plans, events.put))
        while not isinstance(events.get(timeout=120), JobDone):
            pass
        assert scheduler.stats.drafted_tokens == 0
