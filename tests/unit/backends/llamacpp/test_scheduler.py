"""The scheduler on the default Gemma model, in process: where a job lands, what a failed decode and a shutdown
tell the jobs they hit. Jobs go in through `submit` and their events come back through their sinks, as the engine
drives it."""

from __future__ import annotations

import contextlib
import queue
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace

import pytest

from tokenrelay.backends.base import TextDelta
from tokenrelay.backends.llamacpp.context import ATTENTION_TILE
from tokenrelay.backends.llamacpp.cpu import build_features
from tokenrelay.backends.llamacpp.jobs import Job, JobDone, JobFailed, SeqFinished, SeqPlan
from tokenrelay.backends.llamacpp.kernels import TILED_KERNEL_SWITCH
from tokenrelay.backends.llamacpp.model import LlamaModel
from tokenrelay.backends.llamacpp.sampling import SamplingParams
from tokenrelay.backends.llamacpp.scheduler import Scheduler, long_flash_attention
from tokenrelay.config import EngineSettings
from tokenrelay.errors import InvalidRequest

SETTINGS = EngineSettings(slots=2, ctx_per_slot=256, threads=2, prefill_chunk=64, long_slots=0)
STORY = "The archive holds letters, maps and ledgers from the old harbour office. "


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
    monkeypatch.setattr(scheduler.lanes[0].context, "decode", lambda prompt=False: -1)
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


@contextmanager
def running(model: LlamaModel, **settings: object) -> Iterator[Scheduler]:
    """A scheduler with `settings` over the module's, stopped at the end."""
    scheduler = Scheduler(model, SETTINGS.model_copy(update=settings))
    scheduler.start()
    try:
        yield scheduler
    finally:
        scheduler.stop()


class Timeline:
    """Every job's events in the order the scheduler thread sent them, each tagged with its job's name."""

    def __init__(self) -> None:
        self.events: queue.SimpleQueue[tuple[str, object]] = queue.SimpleQueue()
        self.seen: list[tuple[str, object]] = []

    def job(self, model: LlamaModel, name: str, text: str, max_tokens: int, background: bool = False) -> Job:
        prompt = model.tokenize(text, add_special=True, parse_special=False)
        plan = SeqPlan(index=0, params=SamplingParams(temperature=0.0), max_tokens=max_tokens, stops=[])
        return Job(prompt, [plan], lambda event: self.events.put((name, event)), background=background)

    def until_done(self, *names: str) -> None:
        ended = {n for n, e in self.seen if isinstance(e, JobDone | JobFailed)}
        pending = set(names) - ended
        while pending:
            name, event = self.events.get(timeout=60)
            self.seen.append((name, event))
            if isinstance(event, JobDone | JobFailed):
                pending.discard(name)

    def next(self) -> None:
        """Wait for one more event, however long the scheduler takes (a short timeout: callers poll)."""
        with contextlib.suppress(queue.Empty):
            self.seen.append(self.events.get(timeout=0.05))

    def until_first(self, name: str, kind: type) -> None:
        while not any(n == name and isinstance(e, kind) for n, e in self.seen):
            self.seen.append(self.events.get(timeout=60))

    def first(self, name: str, kind: type) -> int:
        return next(i for i, (n, e) in enumerate(self.seen) if n == name and isinstance(e, kind))

    def text(self, name: str) -> str:
        return "".join(e.text for n, e in self.seen if n == name and isinstance(e, TextDelta))


def test_a_context_smaller_than_the_prefill_chunk_evaluates_prompts_in_smaller_steps(model: LlamaModel) -> None:
    # One slot of 64 cells: llama.cpp gives the sequence 256 (its padding) but takes at most 64 tokens a step.
    with running(model, slots=1, ctx_per_slot=64, prefill_chunk=512) as scheduler:
        timeline = Timeline()
        prompt = "One two three four five six seven eight nine ten eleven twelve thirteen fourteen. " * 8
        job = timeline.job(model, "long", prompt, 4)
        assert 64 < len(job.prompt) < 250
        scheduler.submit(job)
        timeline.until_done("long")
    ends = [e for _, e in timeline.seen if isinstance(e, JobDone | JobFailed)]
    assert len(ends) == 1 and isinstance(ends[0], JobDone)


def test_background_work_waits_for_the_interactive_jobs_and_pauses_while_they_run(model: LlamaModel) -> None:
    with running(model, interactive_slots=1) as scheduler:
        alone = Timeline()
        scheduler.submit(alone.job(model, "batch", STORY, 40, background=True))
        alone.until_done("batch")

        timeline = Timeline()
        scheduler.submit(timeline.job(model, "batch", STORY, 40, background=True))
        timeline.seen.append(timeline.events.get(timeout=60))  # the batch job is under way
        scheduler.submit(timeline.job(model, "chat", "A short question about maps?", 6))
        timeline.until_done("chat", "batch")
    chat_start, chat_end = timeline.first("chat", TextDelta), timeline.first("chat", JobDone)
    during = [n for n, e in timeline.seen[chat_start:chat_end] if isinstance(e, TextDelta)]
    assert during and set(during) == {"chat"}  # the batch job made no step while the interactive one ran
    assert timeline.first("batch", JobDone) > chat_end
    assert timeline.text("batch") == alone.text("batch")  # paused, its cache kept: the same greedy answer


def test_an_interactive_job_that_finds_no_free_slot_takes_the_background_one_with_least_done(
    model: LlamaModel,
) -> None:
    with running(model, interactive_slots=0) as scheduler:
        alone = Timeline()
        scheduler.submit(alone.job(model, "older", STORY, 40, background=True))
        alone.until_done("older")

        timeline = Timeline()

        def until_text(name: str, pieces: int) -> None:
            while sum(1 for n, e in timeline.seen if n == name and isinstance(e, TextDelta)) < pieces:
                timeline.seen.append(timeline.events.get(timeout=60))

        scheduler.submit(timeline.job(model, "older", STORY, 40, background=True))
        until_text("older", 5)
        scheduler.submit(timeline.job(model, "younger", "A list of harbours:", 40, background=True))
        until_text("younger", 1)  # both slots are taken by background work
        scheduler.submit(timeline.job(model, "chat", "A short question about maps?", 6))
        timeline.until_done("chat", "older", "younger")
    ends = {n: e for n, e in timeline.seen if isinstance(e, JobDone | JobFailed)}
    assert isinstance(ends["younger"], JobFailed) and ends["younger"].status == 503
    assert isinstance(ends["chat"], JobDone) and isinstance(ends["older"], JobDone)
    assert timeline.first("younger", JobFailed) < timeline.first("chat", TextDelta)  # the chat did not wait for a slot
    assert timeline.text("older") == alone.text("older")  # the job kept was paused, not disturbed


@pytest.mark.parametrize("step", [1, 4], ids=["during-its-prompt", "while-decoding"])
def test_an_interactive_arrival_aborts_a_background_step_which_runs_again_unchanged(
    model: LlamaModel, step: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    with running(model, interactive_slots=1) as scheduler:
        alone = Timeline()
        scheduler.submit(alone.job(model, "batch", STORY * 2, 24, background=True))
        scheduler.submit(alone.job(model, "chat", "A short question about maps?", 6))
        alone.until_done("batch", "chat")

        timeline = Timeline()
        chat = timeline.job(model, "chat", "A short question about maps?", 6)
        real_decode, calls = scheduler.lanes[0].context.decode, []

        def decode(prompt: bool = False) -> int:
            # The chat arrives while the scheduler is inside the batch job's `step`th decode.
            calls.append(1)
            if len(calls) == step:
                scheduler.submit(chat)
            return real_decode(prompt)

        monkeypatch.setattr(scheduler.lanes[0].context, "decode", decode)
        before = scheduler.stats.aborted_steps
        scheduler.submit(timeline.job(model, "batch", STORY * 2, 24, background=True))
        timeline.until_done("chat", "batch")
        assert scheduler.stats.aborted_steps - before == 1
    assert timeline.first("chat", JobDone) < timeline.first("batch", JobDone)
    assert timeline.text("batch") == alone.text("batch")  # taken back and decoded again: the same greedy answer
    assert timeline.text("chat") == alone.text("chat")


def test_background_work_leaves_the_cache_of_an_interactive_request_for_its_next_turn(model: LlamaModel) -> None:
    with running(model, interactive_slots=0) as scheduler:
        timeline = Timeline()
        scheduler.submit(timeline.job(model, "chat", STORY * 3, 4))
        timeline.until_done("chat")
        # A line with the very same prompt could reuse the chat's slot; it takes the other one instead, starting
        # from a copy of the chat's cells.
        scheduler.submit(timeline.job(model, "batch", STORY * 3, 4, background=True))
        timeline.until_done("batch")
        copies = scheduler.stats.prefix_copies
        scheduler.submit(timeline.job(model, "next turn", STORY * 3 + "The maps", 4))
        timeline.until_done("next turn")
    done = {name: event for name, event in timeline.seen if isinstance(event, JobDone)}
    assert copies == 1 and done["batch"].cached_tokens == done["chat"].prompt_tokens - 1
    assert done["next turn"].cached_tokens >= done["chat"].prompt_tokens - 1


def test_a_prompt_longer_than_a_slot_runs_in_a_long_slot_without_holding_back_the_short_ones(
    model: LlamaModel,
) -> None:
    with running(model, long_slots=1, max_context=1024) as scheduler:
        assert [len(lane.slots) for lane in scheduler.lanes] == [2, 1]
        short, long = (lane.cells for lane in scheduler.lanes)
        # Without max_tokens a prompt goes where it fills at most half a slot; with it, where both fit.
        assert scheduler.width_for(100, None, 1) == short and scheduler.width_for(200, None, 1) == long
        assert scheduler.width_for(100, 100, 1) == short and scheduler.width_for(100, 500, 1) == long
        assert scheduler.width_for(long, None, 1) is None and scheduler.width_for(300, 8, 2) is None
        timeline = Timeline()
        first, second = (timeline.job(model, name, STORY * 20, 8) for name in ("long", "long again"))
        assert len(first.prompt) > scheduler.lanes[0].cells
        scheduler.submit(first)
        scheduler.submit(second)  # waits for the one long slot
        scheduler.submit(timeline.job(model, "short", "A short question about maps?", 4))
        timeline.until_done("long", "long again", "short")
        two = Job(first.prompt, [*first.seqs, replace(first.seqs[0], index=1)], lambda event: None)
        with pytest.raises(InvalidRequest) as refused:
            scheduler.submit(two)
        assert refused.value.param == "n"
    done = {name: event for name, event in timeline.seen if isinstance(event, JobDone | JobFailed)}
    assert all(isinstance(event, JobDone) for event in done.values())
    assert timeline.first("short", JobDone) < timeline.first("long again", JobDone)
    # Its turn found the prompt in the long slot, reused up to where a piece of it starts.
    assert done["long again"].cached_tokens == (len(first.prompt) - 1) // 64 * 64 > 0
    assert timeline.text("long again") == timeline.text("long")


@pytest.mark.parametrize(
    ("setting", "kv", "head_dim", "flash"),
    [
        ("auto", "f16", 64, False),  # SmolLM2's heads: plain matrix products decode faster
        ("auto", "f16", 256, True),  # Gemma 3's
        ("on", "f16", 64, True),
        ("off", "f16", 256, False),
        ("off", "q8_0", 64, True),  # a quantised cache needs flash attention whatever the setting
    ],
)
def test_a_long_slot_uses_flash_attention_for_large_heads_unless_told(
    setting: str, kv: str, head_dim: int, flash: bool
) -> None:
    settings = EngineSettings.model_validate({"long_flash_attention": setting, "long_kv_type": kv})
    assert long_flash_attention(settings, head_dim) is flash


def test_a_long_prompt_evaluates_beside_the_streams_without_stalling_them_or_changing_its_answer(
    model: LlamaModel,
) -> None:
    """A long prompt's pieces run on a core of their own while a short job decodes on the other, so the stream
    gets several tokens per piece instead of one; the long answer is the one it gives alone."""
    with running(model, long_slots=1, max_context=2048, prefill_chunk=256) as scheduler:
        alone = Timeline()
        scheduler.submit(alone.job(model, "long", STORY * 100, 8))
        alone.until_done("long")
        assert scheduler.stats.pieces_beside == 0  # nothing to run beside

        timeline, token_times = Timeline(), []
        stream = timeline.job(model, "stream", "A story about the harbour:", 200)
        forward = stream.sink
        stream.sink = lambda event: (token_times.append(time.time_ns()), forward(event))
        scheduler.submit(stream)
        timeline.until_first("stream", TextDelta)
        long = timeline.job(model, "long", "Again. " + STORY * 100, 8)  # nothing cached: every piece evaluates
        scheduler.submit(long)
        timeline.until_done("long")
        pieces = scheduler.stats.pieces_beside
        timeline.until_done("stream")
    assert pieces >= len(long.prompt) // 256 - 1 > 2
    streamed = sum(1 for t in token_times if long.placed_ns < t < long.prompt_done_ns)
    assert streamed > 2 * pieces  # between its steps the stream would get one token a piece
    again = Timeline()
    with running(model, long_slots=1, max_context=2048, prefill_chunk=256) as scheduler:
        scheduler.submit(again.job(model, "long", "Again. " + STORY * 100, 8))
        again.until_done("long")
    assert timeline.text("long") == again.text("long") and timeline.text("long")


def test_a_long_slot_keeps_a_window_of_gemmas_sliding_layers_and_a_next_turn_answers_as_a_fresh_one(
    model: LlamaModel,
) -> None:
    """Gemma's sliding-window layers keep only their window in a long slot: turn 1's prompt and its answer are
    longer than that window, so the answer's cells overwrite cells of the prompt. Turn 2 resends both and starts
    from the checkpoint where its last piece starts; its tokens and log-probabilities are a fresh evaluation's."""
    settings = {"long_slots": 1, "max_context": 2048, "prefill_chunk": 128}
    first = STORY * 70  # about 1,000 tokens: more than the window's cells (512 + a piece, rounded up)

    def turn(scheduler: Scheduler, timeline: Timeline, name: str, text: str, tokens: int) -> Job:
        prompt = model.tokenize(text, add_special=True, parse_special=False)
        params = SamplingParams(temperature=0.0, top_logprobs=0)
        plan = SeqPlan(index=0, params=params, max_tokens=tokens, stops=[])
        job = Job(prompt, [plan], lambda event: timeline.events.put((name, event)))
        scheduler.submit(job)
        timeline.until_done(name)
        return job

    def logprobs(timeline: Timeline, name: str) -> list[float | None]:
        return [lp.logprob for n, e in timeline.seen if n == name and isinstance(e, TextDelta) for lp in e.logprobs]

    with running(model, **settings) as scheduler:
        assert scheduler.lanes[1].window and model.sliding_window == 512
        timeline = Timeline()
        turn(scheduler, timeline, "turn 1", first, 120)
        second = first + timeline.text("turn 1") + " The ledgers"
        turn(scheduler, timeline, "turn 2", second, 24)
    done = {name: event for name, event in timeline.seen if isinstance(event, JobDone)}
    assert done["turn 2"].cached_tokens >= 768
    fresh = Timeline()
    with running(model, **settings) as scheduler:
        turn(scheduler, fresh, "turn 2", second, 24)
    assert timeline.text("turn 2") == fresh.text("turn 2") and logprobs(timeline, "turn 2")
    assert logprobs(timeline, "turn 2") == logprobs(fresh, "turn 2")
    with running(model, **settings, long_window=False) as scheduler:
        assert not scheduler.lanes[1].window  # every cell kept, as in the short slots


@pytest.mark.skipif("AVX2 = 1" not in build_features(), reason="llama.cpp repacks Gemma's Q4_K weights with AVX2")
@pytest.mark.parametrize("repack", [True, False])
def test_a_long_slot_computes_with_repacked_weights_and_the_short_slots_with_the_plain_ones(
    model: LlamaModel, repack: bool
) -> None:
    with running(model, long_slots=1, max_context=2048, long_repack=repack) as scheduler:
        short, long = scheduler.lanes
        assert long.status()["repacked_weights"] is None  # its context is made on first use
        timeline = Timeline()
        scheduler.submit(timeline.job(model, "long", STORY * 20, 4))
        scheduler.submit(timeline.job(model, "short", "A short question about maps?", 4))
        timeline.until_done("long", "short")
        assert long.status()["repacked_weights"] is repack and short.status()["repacked_weights"] is False
        assert timeline.text("long") and timeline.text("short")


def test_a_background_piece_aborted_in_a_window_slot_runs_again_from_its_checkpoint_unchanged(
    model: LlamaModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A batch line's prompt piece in Gemma's long slot, aborted by an interactive arrival once the window has
    wrapped: the piece is taken back to the checkpoint it started from and runs again, with the answer it gets
    alone."""
    settings = {"long_slots": 1, "max_context": 2048, "prefill_chunk": 128}
    alone = Timeline()
    with running(model, **settings) as scheduler:
        scheduler.submit(alone.job(model, "batch", STORY * 70, 24, background=True))
        alone.until_done("batch")
    timeline = Timeline()
    with running(model, **settings) as scheduler:
        long = scheduler.lanes[1].context
        real_decode, calls = long.decode, []

        def decode(prompt: bool = False) -> int:
            calls.append(1)
            if len(calls) == 7:  # the seventh piece: past the window's cells, which the sixth filled
                scheduler.submit(timeline.job(model, "chat", "A short question about maps?", 6))
            return real_decode(prompt)

        monkeypatch.setattr(long, "decode", decode)
        scheduler.submit(timeline.job(model, "batch", STORY * 70, 24, background=True))
        timeline.until_done("chat", "batch")
        aborted = scheduler.stats.aborted_steps
    assert aborted == 1
    assert timeline.text("batch") == alone.text("batch") and timeline.text("batch")


def test_a_long_job_cancelled_while_its_piece_runs_beside_frees_its_slot_at_once(model: LlamaModel) -> None:
    with running(model, long_slots=1, max_context=4096, prefill_chunk=512) as scheduler:
        timeline = Timeline()
        scheduler.submit(timeline.job(model, "stream", "A story about the harbour:", 400))
        timeline.until_first("stream", TextDelta)
        evaluated = scheduler.stats.prompt_tokens_evaluated
        long = timeline.job(model, "long", STORY * 200, 8)
        scheduler.submit(long)
        while scheduler.stats.pieces_beside == 0:
            timeline.next()
        long.cancelled.set()
        # The long slot is the only one this prompt fits: it runs once the cancelled piece has stopped.
        scheduler.submit(timeline.job(model, "after", "Ledgers and maps. " * 200, 8))
        timeline.until_done("after", "stream")
        evaluated = scheduler.stats.prompt_tokens_evaluated - evaluated
    done = {name: event for name, event in timeline.seen if isinstance(event, JobDone)}
    assert "long" not in done and "after" in done
    long_evaluated = evaluated - (done["after"].prompt_tokens - done["after"].cached_tokens)
    assert long_evaluated < len(long.prompt) - 512  # stopped partway, not run to the end of the prompt


def test_a_prompt_whose_prefix_another_running_job_holds_starts_from_a_copy_of_its_cells(model: LlamaModel) -> None:
    """Two requests with one long preamble at the same time: the second copies the first's cells instead of
    evaluating the preamble again, and answers as it does alone."""
    preamble = STORY * 12
    with running(model) as scheduler:
        timeline = Timeline()
        first = timeline.job(model, "first", preamble, 40)
        scheduler.submit(first)
        timeline.until_first("first", TextDelta)  # its slot holds the preamble, and it is still decoding
        scheduler.submit(timeline.job(model, "second", preamble + "The maps", 6))
        timeline.until_done("first", "second")
        copies = scheduler.stats.prefix_copies
    done = {name: event for name, event in timeline.seen if isinstance(event, JobDone)}
    # All of the preamble but what leaves the prompt's last piece a tile of rows (`Lane.unit`).
    assert copies == 1 and done["second"].cached_tokens >= done["second"].prompt_tokens - ATTENTION_TILE
    alone = Timeline()
    with running(model) as scheduler:
        scheduler.submit(alone.job(model, "second", preamble + "The maps", 6))
        alone.until_done("second")
    assert timeline.text("second") == alone.text("second")


@pytest.mark.parametrize("v_type", ["f16", "q8_0"])
def test_the_short_slots_are_batch_invariant_with_either_v_cache(model: LlamaModel, v_type: str) -> None:
    """The attention kernel follows the K cache's type (Q8_0: row by row), so either V keeps a sequence's logits
    the same alone and beside others; the start-up probe measures it, beside steps with a thread less included."""
    with running(model, slots=4, v_type=v_type, long_slots=1) as scheduler:
        assert scheduler.kernels_invariant is True


def test_short_slots_with_an_f16_cache_answer_a_prompt_alone_as_beside_others(model: LlamaModel) -> None:
    """Over an F16 cache llama.cpp's attention takes one kernel for 64 query rows of a sequence or more and another
    below, and it cuts a pass of several sequences into parts of as many rows each. Prompt pieces of whole tiles of
    64 rows together, each prompt's last piece with its rest in a pass of its own, and prompts under a tile beside the
    decoding rows keep what computes each position a function of the prompt: a prompt answers the same (to the bit
    of its tokens' logprobs) alone, in a step beside a shorter prompt, beside another ending in that step, and cut
    where a longer one left the step's budget."""
    update = {"slots": 4, "ctx_per_slot": 1024, "kv_type": "f16", "prefill_chunk": 512}

    def answers(*texts: str) -> list[tuple[str, float | None]]:
        scheduler = Scheduler(model, SETTINGS.model_copy(update=update))
        assert scheduler.lanes[0].context.kv_type == "f16"
        outs = []
        for text in texts:  # all there before the first step, so they start in one step
            prompt = model.tokenize(text, add_special=True, parse_special=False)
            plan = SeqPlan(index=0, params=SamplingParams(temperature=0.0, score=True), max_tokens=6, stops=[])
            outs.append(Collected())
            scheduler.submit(Job(prompt, [plan], outs[-1].events.put))
        scheduler.start()
        try:
            seen = [out.until_end() for out in outs]
        finally:
            scheduler.stop()
        texts_out = ["".join(e.text for e in events if isinstance(e, TextDelta)) for events in seen]
        scores = [next(e.mean_logprob for e in events if isinstance(e, SeqFinished)) for events in seen]
        return list(zip(texts_out, scores, strict=True))

    long, short = STORY * 33, "The maps were drawn by hand."  # ~500 tokens: the budget has ~12 left beside it
    other = "A recipe for bread needs flour, water, salt and patience, and the oven must be hot. " * 8
    assert answers(long, short)[0] == answers(long)[0]
    assert answers(long, other)[1] == answers(other)[0]
    # Two prompts of a tile and more, both ending in one step (~160 and ~105 tokens): pieces of unequal rows.
    assert answers(other, STORY * 7) == answers(other) + answers(STORY * 7)


def test_without_kernels_chosen_pass_by_pass_the_short_slots_keep_a_q8_0_k_cache(
    model: LlamaModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An F16 K cache's attention kernel goes by a pass's shape; where kernels cannot be chosen pass by pass (here:
    a kernel switch the user set), the short slots take the Q8_0 K whose kernel is the same at any shape."""
    monkeypatch.setenv(TILED_KERNEL_SWITCH, "0")  # read once per process by llama.cpp: only our check sees it
    scheduler = Scheduler(model, SETTINGS.model_copy(update={"kv_type": "f16"}))
    try:
        context = scheduler.lanes[0].context
        assert context.kernels is None and scheduler.lanes[0].status()["kv_cache"] == "q8_0/f16"
    finally:
        scheduler.stop()
    monkeypatch.delenv(TILED_KERNEL_SWITCH)
    scheduler = Scheduler(model, SETTINGS.model_copy(update={"kv_type": "f16"}))
    try:
        assert scheduler.lanes[0].status()["kv_cache"] == "f16/f16"
    finally:
        scheduler.stop()
