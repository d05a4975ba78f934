"""The scheduler on the default Gemma model, in process: where a job lands, what a failed decode and a shutdown
tell the jobs they hit. Jobs go in through `submit` and their events come back through their sinks, as the engine
drives it."""

from __future__ import annotations

import queue
from collections.abc import Iterator

import pytest
from servers import shared_data_dir

from tokenrelay.backends.llamacpp.default_model import ensure_default_model
from tokenrelay.backends.llamacpp.jobs import Job, JobDone, JobFailed, SeqFinished, SeqPlan
from tokenrelay.backends.llamacpp.model import LlamaModel
from tokenrelay.backends.llamacpp.sampling import SamplingParams
from tokenrelay.backends.llamacpp.scheduler import Scheduler
from tokenrelay.config import EngineSettings

SETTINGS = EngineSettings(slots=2, ctx_per_slot=256, threads=2, prefill_chunk=64)
STORY = "The archive holds letters, maps and ledgers from the old harbour office. "


@pytest.fixture(scope="module")
def model() -> Iterator[LlamaModel]:
    with pytest.MonkeyPatch.context() as env:
        env.setenv("GGML_CPU_TILED_MM", "0")  # what the server sets (batch-invariant kernels); gone after the module
        loaded = LlamaModel(ensure_default_model(shared_data_dir()))
        yield loaded
        loaded.close()


@pytest.fixture
def scheduler(model: LlamaModel) -> Iterator[Scheduler]:
    running = Scheduler(model, SETTINGS)
    running.start()
    yield running
    running.stop()


class Collected:
    """A job's events, as its sink receives them on the scheduler thread."""

    def __init__(self) -> None:
        self.events: queue.SimpleQueue[object] = queue.SimpleQueue()

    def until_end(self) -> list[object]:
        seen = []
        while True:
            event = self.events.get(timeout=60)
            seen.append(event)
            if isinstance(event, JobDone | JobFailed):
                return seen


def job(model: LlamaModel, text: str, max_tokens: int = 4) -> tuple[Job, Collected]:
    out = Collected()
    prompt = model.tokenize(text, add_special=True, parse_special=False)
    plan = SeqPlan(index=0, params=SamplingParams(temperature=0.0), max_tokens=max_tokens, stops=[])
    return Job(prompt, [plan], out.events.put), out


def test_a_job_lands_in_the_slot_that_holds_its_prefix(model: LlamaModel, scheduler: Scheduler) -> None:
    first, first_out = job(model, STORY * 3)
    scheduler.submit(first)
    done = first_out.until_end()[-1]
    assert isinstance(done, JobDone) and done.cached_tokens == 0
    other, other_out = job(model, "Something else entirely.")
    scheduler.submit(other)
    other_out.until_end()
    # Both slots are free again; the one that evaluated the story is chosen, and only the new words are evaluated.
    evaluated = scheduler.stats.prompt_tokens_evaluated
    follow, follow_out = job(model, STORY * 3 + "The letters")
    scheduler.submit(follow)
    done = follow_out.until_end()[-1]
    assert isinstance(done, JobDone)
    assert done.cached_tokens >= len(first.prompt) - 1
    assert scheduler.stats.prompt_tokens_evaluated - evaluated == done.prompt_tokens - done.cached_tokens


def test_a_failed_decode_fails_the_jobs_of_the_step_and_the_engine_goes_on(
    model: LlamaModel, scheduler: Scheduler, monkeypatch: pytest.MonkeyPatch
) -> None:
    failing, failing_out = job(model, STORY)
    monkeypatch.setattr(scheduler.context, "decode", lambda: -1)
    scheduler.submit(failing)
    events = failing_out.until_end()
    assert isinstance(events[-1], JobFailed) and events[-1].status == 500
    monkeypatch.undo()
    healthy, healthy_out = job(model, STORY)
    scheduler.submit(healthy)
    events = healthy_out.until_end()
    assert isinstance(events[-1], JobDone) and events[-1].cached_tokens == 0  # the failed job's cells were dropped
    assert [e.reason for e in events if isinstance(e, SeqFinished)] == ["length"]


def test_stopping_fails_what_runs_and_what_waits_with_a_503(model: LlamaModel) -> None:
    stopping = Scheduler(model, SETTINGS)
    stopping.start()
    outs = []
    for text in ("One", "Two", "Three"):  # two slots: the third waits
        submitted, out = job(model, text, max_tokens=200)
        stopping.submit(submitted)
        outs.append(out)
    outs[0].events.get(timeout=60)  # the first job is decoding
    stopping.stop()
    for out in outs:
        events = out.until_end()
        assert isinstance(events[-1], JobFailed) and events[-1].status == 503
