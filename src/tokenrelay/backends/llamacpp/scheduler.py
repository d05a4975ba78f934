"""Continuous batching: one thread owns the llama.cpp context and runs steps over all active sequences.

Each step gathers one token from every decoding sequence plus prompt tokens (see `planner`), decodes once per
lane (`slots.Lane`: the many short slots, the few long ones), then samples each sequence with its own sampler. A job
runs in the narrowest lane that holds its prompt and output. Jobs join and leave between steps; a job's prompt is
evaluated once and its KV copied to the slots of its other choices.

A long slot's prompt piece that would share a step with other lanes' work instead runs beside them, on the
side thread with one of the cores, while the compute thread goes on decoding the short slots with the others
(`long_prompt_beside`): a piece of 512 tokens takes a second or more on two cores, every stream would stall that
long between tokens. Every kernel llama.cpp picks for a piece of several rows, and for the short slots' steps over a
quantised cache, computes the same at any thread count, so outputs do not change (`LlamaContext.set_threads`).

Background jobs (batch lines) come after interactive ones: they take a slot only when no interactive job waits
and `interactive_slots` stay free, they are left out of the steps while any interactive job runs (their cache
kept), and an interactive job that finds no free slot takes one from them (`_preempt`), so a batch costs
interactive requests neither a slot nor step time, yet may use every slot while nothing else runs. An interactive
job that arrives during a step of background jobs only aborts that step (`AbortFlag`), rather than waiting for it:
the step's tokens are taken back and decoded again later.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from concurrent.futures import wait as wait_for
from dataclasses import dataclass

from tokenrelay.backends.base import TextDelta, TokenLogprob, TopLogprob, unlimited_slot
from tokenrelay.backends.llamacpp.context import ATTENTION_TILE, LlamaContext, cells_per_sequence, step_rows
from tokenrelay.backends.llamacpp.drafts import DraftCosts, lookup_draft
from tokenrelay.backends.llamacpp.invariance import kernels_invariant
from tokenrelay.backends.llamacpp.jobs import Job, JobDone, JobFailed, PromptScored, SeqFinished
from tokenrelay.backends.llamacpp.model import LlamaModel
from tokenrelay.backends.llamacpp.planner import PrefillNeed, StepPlan, plan_step
from tokenrelay.backends.llamacpp.sampling import Draw, TokenSampler, logits_row, scale
from tokenrelay.backends.llamacpp.slots import EngineStats, Lane, Sequence, Slot, common_prefix
from tokenrelay.backends.llamacpp.textstream import Released, TextStream
from tokenrelay.backends.llamacpp.windows import resume, settle
from tokenrelay.config import EngineSettings
from tokenrelay.errors import InvalidRequest, Overloaded

log = logging.getLogger(__name__)

_ABORTED = 2  # llama_decode's status when the abort callback stopped it
COPY_AT_LEAST = 16  # prompt tokens a copy of another slot's cells must save (the copy takes a few ms)
_SIDE_POLL = 0.01  # s: how often a scheduler with only a side piece running looks for new jobs

Chunk = tuple[Slot, int, int]  # a prompt piece in a batch: its slot, its first row, its first position
Before = dict[int, tuple[int, list[int]]]  # per sequence of a pass: cached tokens and pending prompt before it


@dataclass(eq=False)
class SidePass:
    """A long slot's prompt piece running on the side thread."""

    lane: Lane
    future: Future[int]
    chunks: list[Chunk]
    before: Before
    rows: int
    started: float


class Scheduler:
    """Owns the context; everything below `run` executes on the scheduler thread only."""

    def __init__(self, model: LlamaModel, settings: EngineSettings, known_invariance: bool | None = None) -> None:
        """`known_invariance`: the probe's verdict for this model, build, machine and settings, when one was kept."""
        self.model = model
        self.settings = settings
        self._long_model: LlamaModel | None = None
        self.lanes = open_lanes(model, settings, self._long_weights)
        self.slots = [slot for lane in self.lanes for slot in lane.slots]
        self.stats = EngineStats()
        # Guesses (`drafts`) fill a narrow step up to this many rows: one more row of a lone sequence costs a fraction
        # of the step (the weights are read once for all rows), while a wide step already pays for every row it has.
        # A recurrent model's state cannot drop a wrong guess, so its steps carry none.
        capacity = self.lanes[0].context.batch.capacity  # only the short slots' steps carry guesses
        self._draft_rows = 1 if model.recurrent else min(1 + settings.draft_tokens, capacity)
        self.draft_costs = DraftCosts(most_rows=self._draft_rows)
        # Measured by the scheduler thread before its first step, unless a verdict for the same setup was kept.
        self.kernels_invariant: bool | None = known_invariance
        self._probed = threading.Event()
        self._inbox: queue.SimpleQueue[Job | None] = queue.SimpleQueue()
        self._waiting: deque[Job] = deque()
        self._background: deque[Job] = deque()
        self._queued = 0
        self._serial = 0
        self._lock = threading.Lock()
        self._background_step: LlamaContext | None = None  # decoding for background jobs only: an arrival aborts it
        self._interactive_arrived = False  # an interactive job came since the scheduler last took its inbox
        self._side: SidePass | None = None  # the prompt piece running beside the steps, if any
        self._beside = settings.long_prompt_beside and settings.threads >= 2 and any(lane.beside for lane in self.lanes)
        self._thread = threading.Thread(target=self.run, name=f"llama-scheduler-{model.path.name}", daemon=True)
        self._stopping = False

    # Called from other threads ------------------------------------------------------------------
    def start(self) -> None:
        """Start the scheduler thread; returns once it has probed the kernels and is ready for jobs."""
        self._thread.start()
        self._probed.wait()

    def stop(self) -> None:
        self._stopping = True
        self._inbox.put(None)
        if self._thread.ident is not None:  # a scheduler made but never started has only its lanes to close
            self._thread.join(timeout=30)
        for lane in self.lanes:
            lane.close()
        if self._long_model not in (None, self.model):
            self._long_model.close()

    def _long_weights(self) -> LlamaModel:
        """The weights a long slot computes with: a repacked copy where this CPU has one (`repack`), made once."""
        if self._long_model is None:
            copy = None
            try:
                copy = self.model.repacked_copy() if self.settings.long_repack else None
            except RuntimeError as exc:  # a speed-up only: the long slots then compute with the plain weights
                log.warning("model %s: long slots without repacked weights (%s)", self.model.path.name, exc)
            if copy is not None:
                log.info("model %s: a long slot's weights repacked for this CPU", self.model.path.name)
            self._long_model = copy or self.model
        return self._long_model

    @property
    def n_ctx(self) -> int:
        """The most tokens a request's prompt and output may take: a long slot's cells, else a slot's."""
        return self.lanes[-1].cells

    def width_for(self, prompt: int, max_tokens: int | None, sequences: int) -> int | None:
        """The cells per slot of the narrowest lanes with a slot per sequence whose slots hold the prompt and
        `max_tokens`; without max_tokens, of those whose slots the prompt fills at most half of (the answer's room),
        else of the widest that hold the prompt. None when no lane can ever run it."""
        widths = sorted({lane.cells for lane in self.lanes if len(lane.slots) >= sequences})
        if max_tokens is None:
            return unlimited_slot(widths, prompt)
        return next((cells for cells in widths if prompt + max_tokens <= cells), None)

    def submit(self, job: Job) -> None:
        """Queue a job; an interactive one is refused (503) when the queue is full. Background jobs are never
        refused: whoever submits them bounds how many it has in flight."""
        width = self.width_for(len(job.prompt), job.max_tokens, len(job.seqs))
        if width is None:  # the engine checked the context, so only the number of sequences can be too many
            most = len(self.lanes[-1].slots)
            raise InvalidRequest(f"A prompt this long may have at most {most} choices on this model.", param="n")
        job.width = width
        with self._lock:
            if not job.background and self._queued >= self.settings.queue_size + self.free_slots_hint(width):
                raise Overloaded(
                    "The server is at capacity for this model; retry shortly.", headers={"Retry-After": "1"}
                )
            self._queued += not job.background
            self._serial += 1
            job.serial = self._serial
            self._inbox.put(job)
            if not job.background:
                self._interactive_arrived = True
                if self._background_step is not None:
                    self._background_step.abort.set()

    def free_slots_hint(self, width: int) -> int:
        """Free slots a job of `width` could take (read without the scheduler's lock: a hint)."""
        return sum(len(lane.free()) for lane in self.lanes if lane.cells == width)

    @property
    def queue_depth(self) -> int:
        return len(self._waiting) + len(self._background)

    @property
    def busy_slots(self) -> int:
        return sum(1 for slot in self.slots if not slot.free)

    # Scheduler thread ---------------------------------------------------------------------------
    def run(self) -> None:
        # The probe decodes too: like every step's decode, on the process's one compute thread (native_thread).
        self._probe()
        while not self._stopping:
            self._receive(block=not self._active())
            self._drop_cancelled()
            self._admit()
            if self._active():
                self._step()
        self._abandon_all("The server is shutting down; retry on another replica.")

    def _probe(self) -> None:
        if self.kernels_invariant is not None:
            self._probed.set()
            return
        lane = self.lanes[0]  # the kernels are the process's; the lane of many slots can show them side by side
        try:
            # Beside a long prompt's piece the short slots' steps run with a thread less: probe them so.
            together_threads = self.settings.threads - 1 if self._beside else self.settings.threads
            self.kernels_invariant = kernels_invariant(
                self.model, lane.context, len(lane.slots), lane.context.step_prefill, together_threads
            )
        except Exception:  # the probe only informs; serving goes on, reported as not invariant
            log.exception("the batch-invariance probe failed")
            self.kernels_invariant = False
        finally:
            self._probed.set()
        if not self.kernels_invariant:
            log.warning(
                "the kernels are not batch-invariant: greedy and seeded outputs may differ when requests share a step "
                '(keep batch_invariant on, kv_type q8_0 and repack_weights off; see README, "Batch invariance")'
            )

    def _abandon_all(self, message: str) -> None:
        """Fail whatever is still running or waiting, so no caller waits forever on a stopped engine."""
        if self._side is not None:
            self._side.lane.context.abort.set()
            self._end_side(wait=True)
        self._receive(block=False)
        jobs = {id(j): j for j in (*self._waiting, *self._background)}
        for slot in self.slots:
            job = slot.holder
            if job is not None:
                jobs[id(job)] = job
                self._release(slot)
        self._waiting.clear()
        self._background.clear()
        for job in jobs.values():
            self._sink(job, JobFailed(message, status=503))

    def _active(self) -> bool:
        """Whether a slot is busy or a piece still runs beside (a cancelled job's, which ends soon)."""
        return self._side is not None or any(not slot.free for slot in self.slots)

    def _receive(self, block: bool) -> None:
        with self._lock:
            self._interactive_arrived = False
        try:
            job = self._inbox.get(block=block and not self._waiting and not self._background)
            while True:
                if job is not None:
                    (self._background if job.background else self._waiting).append(job)
                job = self._inbox.get_nowait()
        except queue.Empty:
            return

    def _drop_cancelled(self) -> None:
        for job in [j for j in self._waiting if j.cancelled.is_set()]:
            self._waiting.remove(job)
            self._dequeued()
        for job in [j for j in self._background if j.cancelled.is_set()]:
            self._background.remove(job)
        for slot in self.slots:
            holder = slot.holder
            if holder is not None and holder.cancelled.is_set():
                self._release(slot)
                if self._side is not None and self._side.lane is slot.lane:
                    slot.lane.context.abort.set()  # its cells are freed as soon as llama.cpp sees the flag

    def _dequeued(self) -> None:
        with self._lock:
            self._queued -= 1

    def _admit(self) -> None:
        """Waiting jobs in arrival order; one that finds no room holds back those after it of its width only."""
        full: set[int] = set()
        for job in list(self._waiting):
            if job.width in full:
                continue
            free = self._room(job)
            if not free:
                full.add(job.width)
                continue
            self._waiting.remove(job)
            self._dequeued()
            self._place(job, free)
        self._admit_background()

    def _lanes_for(self, job: Job) -> list[Lane]:
        """The lanes that may run a job: of its width, with a slot per sequence, and no piece running beside
        (its context is in use until the piece ends)."""
        side = self._side.lane if self._side is not None else None
        return [
            lane
            for lane in self.lanes
            if lane.cells == job.width and len(lane.slots) >= len(job.seqs) and lane is not side
        ]

    def _room(self, job: Job) -> list[Slot]:
        """Free slots of the lanes that may run the job and have a free slot per sequence, background work
        preempted for it if need be; empty when there is no room yet."""
        lanes = self._lanes_for(job)
        roomy = [free for free in (lane.free() for lane in lanes) if len(free) >= len(job.seqs)]
        if roomy:
            return [slot for free in roomy for slot in free]
        for lane in lanes:
            self._preempt(lane, len(job.seqs) - len(lane.free()))
            if len(lane.free()) >= len(job.seqs):
                return lane.free()
        return []

    def _admit_background(self) -> None:
        """Background jobs take the slots interactive ones leave: only while none waits, and leaving the lane's
        `reserve` free (a background job that needs more than that leaves may have every slot, when nothing else
        runs there)."""
        for job in list(self._background) if not self._waiting else []:
            free = [slot for lane in self._lanes_for(job) for slot in self._spare(lane, job)]
            if free:
                self._background.remove(job)
                self._place(job, free)

    @staticmethod
    def _spare(lane: Lane, job: Job) -> list[Slot]:
        """The lane's free slots a background job may have: all, if it leaves the lane's reserve free or the
        lane is idle and has a slot per sequence; else none."""
        free = lane.free()
        if len(free) < len(job.seqs) or (len(free) - lane.reserve < len(job.seqs) and len(free) < len(lane.slots)):
            return []
        return free

    def _preempt(self, lane: Lane, needed: int) -> list[Slot]:
        """Free slots of a lane held by background jobs for an interactive job that finds too few: the jobs that
        have generated least go first (the least work lost). Each fails with a 503, which puts its batch line back
        to run again later; its slots keep their cache, so the rerun's prompt is mostly there already."""
        held: dict[int, Job] = {}
        for slot in lane.slots:
            if slot.holder is not None and slot.holder.background:
                held.setdefault(id(slot.holder), slot.holder)
        freed: list[Slot] = []
        for job in sorted(held.values(), key=lambda job: job.completion_tokens):
            if len(freed) >= needed:
                break
            for slot in [slot for slot in lane.slots if slot.holder is job]:
                self._release(slot)
                freed.append(slot)
            self._sink(job, JobFailed("Preempted by interactive requests; run it again later.", status=503))
        return freed

    def _place(self, job: Job, free: list[Slot]) -> None:
        if job.background:
            free = self._background_choice(free, len(job.seqs))
        # Cached tokens the job could reuse from each slot of the lanes it may take, counted once.
        reusable = {id(slot): self._reusable(slot, job) for lane in {s.lane for s in free} for slot in lane.slots}
        primary, keep = self._slot_for(job, free, reusable)
        keep = self._copy_prefix(primary, keep, reusable)
        keep -= keep % primary.lane.boundary
        mates = [slot for slot in free if slot.lane is primary.lane and slot is not primary]
        others = sorted(mates, key=lambda s: s.last_job)[: len(job.seqs) - 1]
        for slot in (primary, *others):
            slot.last_job = job.serial
            slot.last_interactive = not job.background
        keep = self._cut_back(primary, keep)
        primary.cache = primary.cache[:keep]
        primary.evaluated = min(primary.evaluated, keep)
        primary.job, primary.pending = job, job.prompt[keep:]
        job.cached_tokens = keep
        job.running = len(job.seqs)
        job.placed_ns = time.time_ns()
        for slot in others:
            slot.job, slot.primary = job, primary

    def _copy_prefix(self, slot: Slot, keep: int, reusable: dict[int, int]) -> int:
        """Give `slot` the cells of another slot of its lane, busy or idle, that holds a longer prefix of the job's
        prompt (by at least COPY_AT_LEAST tokens); returns the cached tokens the job keeps. Two requests with one
        long system prompt then evaluate it once even when they run at the same time. Only where a token's cells
        are the same whoever computed them (`boundary` 1)."""
        if slot.lane.boundary != 1:
            return keep
        others = [other for other in slot.lane.slots if other is not slot]
        donor = max(others, key=lambda other: reusable[id(other)], default=None)
        if donor is None or reusable[id(donor)] < keep + COPY_AT_LEAST:
            return keep
        slot.lane.context.copy(donor.seq_id, slot.seq_id)
        slot.cache, slot.evaluated = list(donor.cache), donor.evaluated
        self.stats.prefix_copies += 1
        return reusable[id(donor)]

    def _background_choice(self, free: list[Slot], needed: int) -> list[Slot]:
        """The free slots a background job may take: those interactive jobs did not use last, when there are
        enough of them. An interactive request's cache (a conversation so far, a shared system prompt) then
        outlasts a batch whose lines would reuse it or evict it, for the request's next turn."""
        spare = [slot for slot in free if not slot.last_interactive]
        return spare if len(spare) >= needed else free

    @staticmethod
    def _slot_for(job: Job, free: list[Slot], reusable: dict[int, int]) -> tuple[Slot, int]:
        """The free slot holding the longest prefix of the prompt (`reusable`, by slot), if it holds at least half
        of it; else the slot idle the longest, so that a prompt sharing little with any cache does not evict a long
        one for it. With the slot, how many of its cached tokens the job keeps."""
        best = max(free, key=lambda s: reusable[id(s)])
        if 2 * reusable[id(best)] >= len(job.prompt):
            return best, reusable[id(best)]
        oldest = min(free, key=lambda s: s.last_job)
        return oldest, reusable[id(oldest)]

    def _reusable(self, slot: Slot, job: Job) -> int:
        """Cached tokens a job may reuse from a slot: its longest common prefix with the prompt, never the last
        prompt token (its logits are needed). Prompt logprobs need every position's logits, so nothing is reused.
        Where one kernel serves every pass (`boundary` 1 and `decoded_cells_as_prompted`), a token's cells are the
        same whether it was decoded or read in a prompt, so generated tokens are reused too. Where decoding steps
        and prompt pieces take different kernels (`kernels`), a cell is reused only where the job would compute it
        with the same kernel: in a lane of blocks (`Lane.block`), for a prompt of prompt pieces those that prompt
        pieces computed, leaving the job a piece of `unit` rows or more; for a shorter prompt (decoding rows) all
        of them, where no prompt piece computed any; in a long slot (also attention kernels by shape) those prompt
        pieces computed."""
        if job.prompt_logprobs is not None:
            return 0
        lane = slot.lane
        if lane.block or (lane.boundary == 1 and lane.context.decoded_cells_as_prompted):
            common = common_prefix(slot.cache, job.prompt)
            if lane.block and lane.in_pieces(len(job.prompt)):
                common = min(common, slot.evaluated, len(job.prompt) - lane.unit)
            elif lane.block and slot.evaluated:
                common = 0
        else:
            common = common_prefix(slot.cache[: slot.evaluated], job.prompt)
        return min(common, len(job.prompt) - 1)

    def _step(self) -> None:
        step_started = time.perf_counter()
        self._end_side(wait=False)
        side = self._side.lane if self._side is not None else None
        serving = [s for s in self._served_now() if s.lane is not side]
        background = all(s.holder is not None and s.holder.background for s in serving)
        self.stats.steps += 1
        plans: list[tuple[Lane, StepPlan]] = []
        for lane in self.lanes:
            mine = [s for s in serving if s.lane is lane]
            if not mine:
                continue
            decoding = [s.seq_id for s in mine if s.seq is not None]
            prefilling = [self._prefill_need(s) for s in self._prefill_order(mine)]
            plans.append((lane, plan_step(decoding, prefilling, lane.context.step_prefill)))
        for lane, plan in plans:
            if self._goes_beside(lane, plan, len(plans), background):
                self._start_side(lane, plan.prefill)
        for lane, plan in plans:
            if self._side is None or self._side.lane is not lane:
                self._pass(lane, plan.decode, plan.prefill, background, plan.tails)
        if not plans:
            self._wait_side()
        self.stats.step_seconds += time.perf_counter() - step_started

    @staticmethod
    def _prefill_need(slot: Slot) -> PrefillNeed:
        """What a slot's prompt still needs: in a lane of blocks (`Lane.block`), prompt pieces of `unit` rows or
        more, or for a prompt shorter than a block, its tokens with the decoding rows (a tail)."""
        lane, pending = slot.lane, len(slot.pending)
        if not lane.block:
            return PrefillNeed(slot.seq_id, pending)
        tail = 0 if lane.in_pieces(len(slot.prefilling.prompt)) else pending
        return PrefillNeed(slot.seq_id, pending, tail=tail, unit=lane.unit)

    def _goes_beside(self, lane: Lane, plan: StepPlan, lanes: int, background: bool) -> bool:
        """Whether a lane's pass runs on the side thread: a long slot's prompt piece that would share the step
        with other lanes' interactive work. A piece of one row stays: over an F16 cache its attention would be
        split among the threads, and so depend on their number (`LlamaContext.thread_invariant_steps`)."""
        rows = sum(take for _, take in plan.prefill)
        return (
            self._beside
            and self._side is None
            and lane.beside
            and lanes > 1
            and not background
            and (not plan.decode and rows > 1)
        )

    def _start_side(self, lane: Lane, prefill: list[tuple[int, int]]) -> None:
        context = lane.context
        context.batch.clear()
        before = {seq_id: (len(lane.slots[seq_id].cache), lane.slots[seq_id].pending) for seq_id, _ in prefill}
        chunks = [self._add_prompt_chunk(lane.slots[seq_id], take) for seq_id, take in sorted(prefill)]
        context.set_threads(1)
        context.abort.clear()
        self.stats.pieces_beside += 1
        self._side = SidePass(lane, context.decode_beside(), chunks, before, context.batch.size, time.perf_counter())

    def _wait_side(self) -> None:
        """Nothing runs but the side piece: wait for it to end, or for a job to arrive that can run beside it."""
        while self._side is not None and not self._side.future.done() and self._inbox.empty():
            wait_for([self._side.future], timeout=_SIDE_POLL)

    def _end_side(self, wait: bool) -> None:
        """Take in the side piece's outcome once it has ended (at once, or waiting for it with `wait`). A piece
        whose job was cancelled meanwhile was aborted or is simply dropped; its slot keeps what it computed."""
        side = self._side
        if side is None or not (wait or side.future.done()):
            return
        status = side.future.result()
        self._side = None
        self.stats.decode_seconds += time.perf_counter() - side.started
        if not self._settled(side.lane, status, side.before):
            return
        self.stats.prompt_tokens_evaluated += side.rows
        for slot, first_row, start in side.chunks:
            if slot.job is not None:
                self._after_prefill_chunk(slot, first_row, start)

    def _threads_for(self, lane: Lane) -> int:
        """A pass's threads: one less beside a side piece, where the pass computes the same with fewer: over a
        quantised cache, or in a lane whose prompt pieces take whole tiles (`Lane.unit`): its decoding passes take
        the row-by-row attention (`kernels`), its prompt pieces the tiled one, each giving a query row to one
        thread."""
        threads = self.settings.threads
        invariant = lane.unit > 1 or lane.context.thread_invariant_steps
        return threads - 1 if self._side is not None and invariant else threads

    def _pass(
        self,
        lane: Lane,
        decode: list[int],
        prefill: list[tuple[int, int]],
        background: bool,
        tails: list[tuple[int, int]] | None = None,
    ) -> None:
        """A lane's step. Where prompt pieces and decoding steps take different kernels (`kernels`), it is several
        passes: the prompt pieces, then the decoding rows with the short prompts' `tails` (`Lane.block`). Pieces
        of whole units share a pass, and a prompt's last piece with its rest has one of its own: llama.cpp splits a
        pass into sub-batches of as many rows per sequence, so a sequence's rows in each, and with them its
        attention kernel (`Lane.unit`), would otherwise depend on its neighbours' pieces."""
        if lane.context.kernels is None:
            self._one_pass(lane, decode, prefill, background, tails or [])
            return
        together = [piece for piece in prefill if piece[1] % lane.unit == 0]
        ragged = [piece for piece in prefill if piece[1] % lane.unit]
        for pieces in ([together] if together else []) + [[piece] for piece in ragged]:
            self._one_pass(lane, [], pieces, background, [])
        if decode or tails:
            self._one_pass(lane, decode, [], background, tails or [])

    def _one_pass(
        self,
        lane: Lane,
        decode: list[int],
        prefill: list[tuple[int, int]],
        background: bool,
        tails: list[tuple[int, int]],
    ) -> None:
        """One `llama_decode` over a lane's sequences, then their sampling (logits rows are only valid until the next
        decode): decoding rows, prompt pieces (`prefill`) and short prompts' `tails` computed as decoding rows are.
        A pass of `background` jobs only may be aborted: it is then taken back, as if not run."""
        context, slots = lane.context, lane.slots
        prompted = dict(prefill)
        prefill = prefill + tails
        batch = context.batch
        batch.clear()
        rows: dict[int, list[int]] = {}  # a decoding sequence's rows: its next token's, then its drafts'
        drafts: dict[int, list[int]] = {}
        chunks: list[Chunk] = []
        takes = dict(prefill)
        width = len(decode) + sum(takes.values())  # the step's rows without guesses
        planned = width  # and with those added so far
        # Only a background step can be aborted, so only its sequences' state is kept to take it back.
        before = {s: (len(slots[s].cache), slots[s].pending) for s in [*decode, *takes]} if background else {}
        # In sequence id order: llama.cpp computes a run of consecutive sequence ids in one pass, and starts a
        # new pass (another read of the weights) wherever the next token's id does not follow.
        for seq_id in sorted([*decode, *takes]):
            slot = slots[seq_id]
            if seq_id in takes:
                chunks.append(self._add_prompt_chunk(slot, takes[seq_id], seq_id in prompted))
            else:
                token = slot.decoding.next_token
                assert token is not None  # drawn when the sequence started and at each step it outlived
                rows[seq_id] = [batch.add(token, len(slot.cache), seq_id, True)]
                slot.cache.append(token)
                drafts[seq_id] = self._draft(slot, width, planned)
                planned += len(drafts[seq_id])
                # A draft's cells are written but it joins the cache only once the sampler draws it.
                rows[seq_id] += [batch.add(t, len(slot.cache) + i, seq_id, True) for i, t in enumerate(drafts[seq_id])]
        if batch.size == 0:
            return
        context.set_threads(self._threads_for(lane))
        decode_started = time.perf_counter()
        # A window lane's decoding step is never aborted: its cell took the place of one that fell out of the window,
        # which taking it back cannot undo, and checkpoints are only where prompt pieces start.
        status = self._decode(context, background and not (lane.window and decode), prompt=not decode and not tails)
        decode_seconds = time.perf_counter() - decode_started
        self.stats.decode_seconds += decode_seconds
        if status == _ABORTED:
            self.stats.aborted_steps += 1
        if not self._settled(lane, status, before):
            return
        self.stats.prompt_tokens_evaluated += sum(takes.values())
        if lane.drafts:  # what a step of the lane that takes guesses costs, by its rows
            self.draft_costs.observe(batch.size, decode_seconds)
        for seq_id, seq_rows in rows.items():
            self._sample_run(slots[seq_id], seq_rows, drafts[seq_id])
        for slot, first_row, start in chunks:
            self._after_prefill_chunk(slot, first_row, start)

    def _draft(self, slot: Slot, width: int, rows: int) -> list[int]:
        """Guesses of the tokens after the sequence's next one (`drafts`), within the step's room for them and the
        sequence's token and context limits, as many as are worth their rows in a step of `width` rows without
        guesses and `rows` so far."""
        seq = slot.decoding
        room = (self._draft_rows if slot.lane.drafts else 1) - rows
        limit = min(room, seq.plan.max_tokens - seq.generated - 1, slot.lane.cells - len(slot.cache))
        drafted = lookup_draft(slot.cache, limit)
        drafted = drafted[: self.draft_costs.worth(seq.odds.rate, width, rows, len(drafted))]
        self.stats.drafted_tokens += len(drafted)
        return drafted

    def _sample_run(self, slot: Slot, rows: list[int], drafts: list[int]) -> None:
        """Draw the sequence's tokens from its rows in order: each draft the sampler draws anyway joins the cache
        and the next row is drawn from; at the first it does not (or once the sequence ends), the cells of the
        rest are dropped. The draws are those single steps would have made (see `drafts`)."""
        seq, right = slot.decoding, 0
        for row, draft in zip(rows, [*drafts, None], strict=True):
            draw = seq.sampler.sample(slot.lane.context.ptr, row)
            self._take(slot, draw)
            if slot.seq is None or draft is None or draw.token != draft:
                break
            slot.cache.append(draft)
            right += 1
        if drafts:
            self.stats.accepted_drafts += right
            seq.odds.right += right
            seq.odds.checked += min(len(drafts), right + 1)  # the right ones and the first wrong one, if any
            slot.lane.context.keep_prefix(slot.seq_id, len(slot.cache))

    def _decode(self, context: LlamaContext, background: bool, prompt: bool) -> int:
        """A lane's decode (of prompt pieces only: `prompt`); an interactive arrival aborts a `background` one
        (`submit`), also one that came while the step was being planned."""
        with self._lock:
            self._background_step = context if background else None
            if background and self._interactive_arrived:
                context.abort.set()
            else:
                context.abort.clear()
        try:
            return context.decode(prompt)
        finally:
            with self._lock:
                self._background_step = None

    def _settled(self, lane: Lane, status: int, before: Before) -> bool:
        """Whether a lane's decode ran; an aborted one is undone, a failed one fails the lane's jobs."""
        if status == _ABORTED:
            self._undo(lane, before)
        elif status != 0:
            self._fail_batch(lane)
        return status == 0

    def _undo(self, lane: Lane, before: Before) -> None:
        """An aborted pass, undone: each sequence's cells, cached tokens and pending prompt as before it. llama.cpp
        removed the cells of the part it was computing, not of parts of the pass it had finished."""
        for seq_id, (length, pending) in before.items():
            slot = lane.slots[seq_id]
            kept = self._cut_back(slot, length)
            slot.pending = slot.cache[kept:length] + pending
            del slot.cache[kept:]

    @staticmethod
    def _cut_back(slot: Slot, keep: int) -> int:
        """A slot's cells cut back to its first `keep` tokens, or as near below as its lane allows (a window lane:
        its last checkpoint at or before them; a cache that cannot cut there: nothing); returns the tokens kept."""
        context = slot.lane.context
        if slot.lane.window:
            return resume(context, slot, keep)
        if context.keep_prefix(slot.seq_id, keep):
            return keep
        context.clear(slot.seq_id)
        return 0

    def _served_now(self) -> list[Slot]:
        """The busy slots this step serves: background jobs wait while any interactive job runs."""
        busy = [s for s in self.slots if not s.free]
        interactive = [s for s in busy if s.holder is not None and not s.holder.background]
        return interactive or busy

    def _prefill_order(self, serving: list[Slot]) -> list[Slot]:
        """Prompts are evaluated first come, first served."""
        slots = [s for s in serving if s.job is not None and s.primary is None and s.pending]
        return sorted(slots, key=lambda s: s.prefilling.serial)

    def _add_prompt_chunk(self, slot: Slot, take: int, prompted: bool = True) -> Chunk:
        """A prompt piece's rows in the batch; `prompted` False: a short prompt's, with decoding rows (`Lane.block`)."""
        job = slot.prefilling
        batch = slot.lane.context.batch
        start = len(slot.cache)
        all_logits = job.prompt_logprobs is not None
        first_row = batch.size
        tokens, slot.pending = slot.pending[:take], slot.pending[take:]
        for i, token in enumerate(tokens):
            last = not slot.pending and i == len(tokens) - 1
            batch.add(token, start + i, slot.seq_id, all_logits or last)
        slot.cache.extend(tokens)
        if prompted:
            slot.evaluated = len(slot.cache)  # pieces follow the reused prefix, which prompt pieces computed too
        return slot, first_row, start

    def _after_prefill_chunk(self, slot: Slot, first_row: int, start: int) -> None:
        job = slot.prefilling
        end = len(slot.cache)
        if job.prompt_logprobs is not None:
            self._score_prompt(slot.lane.context, job, job.prompt_logprobs, first_row, start, end)
        if not slot.pending:
            last_row = first_row + (end - start) - 1
            if job.prompt_logprobs is not None:
                self._sink(job, PromptScored(job.scored))
            self._start_sequences(slot, last_row)
        if slot.lane.window and end % slot.lane.boundary == 0:  # the logits read, the cells may move
            settle(slot.lane.context, slot)

    def _score_prompt(self, context: LlamaContext, job: Job, top: int, first_row: int, start: int, end: int) -> None:
        """Logprob of prompt token p+1 from the logits at position p, for every position in the chunk, with the
        `top` likeliest alternatives."""
        if start == 0:
            job.scored = []
        n_vocab = self.model.n_vocab
        for offset, pos in enumerate(range(start, end)):
            if pos < job.echo_from:
                continue
            if pos == job.echo_from:
                job.scored.append(self._entry(job.prompt[pos], None, []))
            if pos + 1 >= len(job.prompt):
                continue
            row = logits_row(context.ptr, first_row + offset, n_vocab)
            scaled = scale(row, 1.0)
            token = job.prompt[pos + 1]
            job.scored.append(self._entry(token, scaled.logprob(token), scaled.top(top)))

    def _start_sequences(self, primary: Slot, row: int) -> None:
        job = primary.prefilling
        job.prompt_done_ns = time.time_ns()
        context = primary.lane.context
        secondaries = [s for s in primary.lane.slots if s.primary is primary]
        shared = None
        if secondaries:
            shared = logits_row(context.ptr, row, self.model.n_vocab).copy()
        for plan, slot in zip(job.seqs, [primary, *secondaries], strict=True):
            if slot is not primary:
                context.copy(primary.seq_id, slot.seq_id)
                slot.cache, slot.evaluated = list(primary.cache), primary.evaluated
                logits_row(context.ptr, row, self.model.n_vocab)[:] = shared
            slot.job, slot.primary, slot.pending = None, None, []
            slot.seq = Sequence(
                plan=plan,
                job=job,
                sampler=TokenSampler(plan.params, self.model.n_vocab, plan.constraint),
                text=TextStream(plan.stops, plan.text_offset),
            )
            if plan.max_tokens == 0:
                self._finish(slot, "length")
            else:
                self._sample(slot, row)

    def _sample(self, slot: Slot, row: int) -> None:
        self._take(slot, slot.decoding.sampler.sample(slot.lane.context.ptr, row))

    def _take(self, slot: Slot, draw: Draw) -> None:
        seq = slot.decoding
        seq.generated += 1
        seq.job.completion_tokens += 1
        self.stats.tokens_generated += 1
        if draw.logprob is not None:
            seq.score += draw.logprob
        if self.model.is_eog(draw.token):
            self._finish(slot, "stop")
            return
        entry = self._draw_entry(draw) if seq.plan.params.top_logprobs is not None else None
        released = seq.text.feed(self.model.piece(draw.token), entry)
        self._emit_text(seq, released)
        if released.stopped:
            self._finish(slot, "stop", flush=False, stop=released.stop)
        elif seq.sampler.complete:  # the grammar's output is whole: nothing more may follow
            self._finish(slot, "stop")
        elif seq.generated >= seq.plan.max_tokens or len(slot.cache) + 1 > slot.lane.cells:
            self._finish(slot, "length")
        else:
            seq.next_token = draw.token

    def _draw_entry(self, draw: Draw) -> TokenLogprob:
        return self._entry(draw.token, draw.logprob, draw.top)

    def _entry(self, token: int, logprob: float | None, top: list[tuple[int, float]]) -> TokenLogprob:
        alternatives = [TopLogprob(self.model.token_text(t), lp, list(self.model.piece(t, True))) for t, lp in top]
        return TokenLogprob(self.model.token_text(token), logprob, list(self.model.piece(token, True)), alternatives)

    def _emit_text(self, seq: Sequence, released: Released) -> None:
        if released.text or released.logprobs:
            self._sink(seq.job, TextDelta(seq.plan.index, released.text, released.logprobs))

    def _finish(self, slot: Slot, reason: str, flush: bool = True, stop: str | None = None) -> None:
        seq = slot.decoding
        if flush:
            self._emit_text(seq, seq.text.flush())
        mean = seq.score / seq.generated if seq.generated else None
        self._sink(seq.job, SeqFinished(seq.plan.index, reason, mean, stop))
        self._release(slot)
        job = seq.job
        job.running -= 1
        if job.running == 0:
            self._sink(job, JobDone(len(job.prompt), job.completion_tokens, job.cached_tokens))

    def _release(self, slot: Slot) -> None:
        slot.seq, slot.job, slot.primary, slot.pending = None, None, None, []

    def _fail_batch(self, lane: Lane) -> None:
        log.error("llama_decode failed; failing the requests in this step")
        failed: dict[int, Job] = {}
        for slot in lane.slots:
            job = slot.holder
            if job is None:
                continue
            lane.context.clear(slot.seq_id)
            slot.cache = []
            slot.checkpoints.clear()
            self._release(slot)
            failed[id(job)] = job
        for job in failed.values():
            self._sink(job, JobFailed("The engine failed to evaluate the batch."))

    @staticmethod
    def _sink(job: Job, event: object) -> None:
        job.sink(event)


DEFAULT_MAX_CONTEXT = 32768  # a long slot's cells when the model's trained context is longer or unknown
SMALL_HEAD_DIM = 128  # below: a long slot's attention is plain matrix products (`long_flash_attention`)


def long_lane_cells(settings: EngineSettings, trained_context: int | None) -> int | None:
    """A long slot's cells (`max_context`, else the trained context up to 32768); None when a short slot holds as
    many, so no long lane is made."""
    cells = cells_per_sequence(settings.max_context or min(trained_context or DEFAULT_MAX_CONTEXT, DEFAULT_MAX_CONTEXT))
    if cells <= cells_per_sequence(settings.ctx_per_slot):
        return None
    return cells


def long_flash_attention(settings: EngineSettings, head_dim: int) -> bool:
    """Flash attention in a long slot: a quantised cache needs it; with an F16 one it is a choice of speed."""
    if settings.long_kv_type != "f16" or settings.long_flash_attention == "on":
        return True
    return settings.long_flash_attention == "auto" and head_dim >= SMALL_HEAD_DIM


def open_lanes(model: LlamaModel, settings: EngineSettings, long_weights: Callable[[], LlamaModel]) -> list[Lane]:
    """The `slots` of `ctx_per_slot` cells, then `long_slots` lanes of one slot with `max_context` cells (by
    default the model's trained context) where that is longer, computing with `long_weights()`.

    A long slot is a context of its own with an F16 cache, whose attention kernels evaluate a long prompt about
    twice as fast as the Q8_0 cache's row-by-row one (docs/benchmarks.md). They are chosen by batch shape, so the
    shape is made a function of the sequence alone: one sequence per context, no guesses beside its token (a step
    is always one row), its prompt evaluated in pieces that start at multiples of the prefill chunk and a cached
    prefix reused only up to such a start. A token's cells are then computed the same way whatever else runs."""
    # Over an F16 cache a prompt piece of a tile of rows or more takes the tiled attention: each piece then has a
    # tile, the last one with the prompt's rest (`Lane.unit`). A budget under a tile keeps every piece under one.
    budget = step_rows(settings, settings.slots, settings.ctx_per_slot) - settings.slots
    tiles = settings.batch_invariant and settings.kv_type == "f16" and budget >= ATTENTION_TILE
    short = LlamaContext(
        model, settings, settings.slots, settings.ctx_per_slot, overrun=ATTENTION_TILE - 1 if tiles else 0
    )
    if settings.batch_invariant and short.kernels is None and short.kv_type != "q8_0":
        # Over an F16 K cache the attention kernel goes by a pass's shape: without kernels chosen pass by pass
        # only a Q8_0 K (row by row at any shape) keeps a sequence's answer independent of what shares its steps.
        log.warning("this llama.cpp build cannot choose kernels pass by pass: the short slots keep a Q8_0 K cache")
        short.close()
        short = LlamaContext(
            model, settings, settings.slots, settings.ctx_per_slot, kv_type="q8_0", v_type=settings.v_type
        )
    lanes = [Lane.open(lambda: short, short.n_ctx_seq, settings.slots, reserve=settings.interactive_slots)]
    if short.kernels is not None:
        # Which kernels compute a position depends on the prompt alone, not on where a step's budget ran out.
        lanes[0].block = ATTENTION_TILE
        if tiles:
            lanes[0].unit = ATTENTION_TILE
    cells = long_lane_cells(settings, model.n_ctx_train)
    if cells is None:
        return lanes
    flash = long_flash_attention(settings, model.head_dim)
    window = settings.long_window and model.sliding_window > 0
    for _ in range(settings.long_slots):
        pieces = step_rows(settings, 1, cells) - 1

        def make() -> LlamaContext:
            kv = settings.long_kv_type
            weights = long_weights()
            return LlamaContext(weights, settings, 1, cells, kv_type=kv, flash_attention=flash, swa_full=not window)

        lanes.append(Lane.open(make, cells, 1, reserve=0, boundary=pieces, drafts=False, beside=True, window=window))
    return lanes
