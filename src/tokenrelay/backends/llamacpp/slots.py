"""What the scheduler keeps per llama.cpp sequence: the lanes, their slots, the sequences decoding in them, the
step counters."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypedDict

from tokenrelay.backends.llamacpp.context import LlamaContext, State
from tokenrelay.backends.llamacpp.drafts import Odds
from tokenrelay.backends.llamacpp.jobs import Job, SeqPlan
from tokenrelay.backends.llamacpp.sampling import TokenSampler
from tokenrelay.backends.llamacpp.textstream import TextStream


@dataclass(eq=False)
class Sequence:
    plan: SeqPlan
    job: Job
    sampler: TokenSampler
    text: TextStream
    generated: int = 0
    score: float = 0.0
    next_token: int | None = None
    odds: Odds = field(default_factory=Odds)  # how often its guesses (`drafts`) were right


@dataclass(eq=False)
class Slot:
    """One llama.cpp sequence id of a lane and what its KV cells hold."""

    seq_id: int
    lane: Lane
    cache: list[int] = field(default_factory=list)  # tokens whose KV is in this sequence's cells
    # Of those, the leading ones whose cells prompt pieces computed (not decoding steps): cut with the cache when a
    # job is placed, set by every prompt piece.
    evaluated: int = 0
    checkpoints: dict[int, State] = field(default_factory=dict)  # a window lane's, by position (`windows`)
    seq: Sequence | None = None  # decoding
    job: Job | None = None  # prefilling (primary slot) or waiting for the prefill (other choices)
    pending: list[int] = field(default_factory=list)  # prompt tokens still to evaluate
    primary: Slot | None = None  # for a secondary: the slot whose prefill it will copy
    last_job: int = 0  # the serial of the last job placed here (0: never used)
    last_interactive: bool = False  # that job was an interactive request (background jobs leave its cache be)

    @property
    def free(self) -> bool:
        return self.seq is None and self.job is None

    @property
    def decoding(self) -> Sequence:
        """The sequence this slot decodes, asked only of a slot the scheduler placed one in."""
        if self.seq is None:
            raise RuntimeError(f"slot {self.seq_id} decodes no sequence")
        return self.seq

    @property
    def prefilling(self) -> Job:
        """The job whose prompt this slot evaluates or waits for, asked only of a slot the scheduler gave one."""
        if self.job is None:
            raise RuntimeError(f"slot {self.seq_id} holds no prompt")
        return self.job

    @property
    def holder(self) -> Job | None:
        """The job whose sequence this slot decodes or will."""
        return self.seq.job if self.seq is not None else self.job


@dataclass(eq=False)
class Lane:
    """One llama.cpp context and its slots, which all have as many KV cells: the many slots of `ctx_per_slot`
    cells, or the few long ones with the model's whole context. A context's cells are allocated when it is made,
    so a long context for every slot would cost memory most requests never use; and one pool shared by all
    sequences (llama.cpp's unified cache) would make a sequence's attention sum its cells in an order that depends
    on its neighbours (`context`). A lane's context is made when a job first runs there, so a long slot's cells
    take memory only once a request has needed them."""

    make: Callable[[], LlamaContext]
    cells: int  # KV cells per slot: the most a request's prompt and output may take here
    slots: list[Slot] = field(default_factory=list)
    reserve: int = 0  # slots background jobs leave free here for interactive ones
    boundary: int = 1  # a cached prefix is reused up to a multiple of this (where prompt pieces start)
    # Where prompt pieces and decoding steps take kernels of their own (`kernels`) in a lane of many slots: a prompt
    # shorter than this goes with the decoding rows, a longer one in prompt pieces (0: no such split, one kernel for
    # every pass).
    block: int = 0
    # A prompt piece has at least this many rows (the last one takes the prompt's rest): over an F16 cache the rows of
    # the tiled attention kernel (`ATTENTION_TILE`), which computes a row the same in any piece of that many.
    unit: int = 1
    drafts: bool = True  # steps may carry guesses (`drafts`) beside a sequence's token
    beside: bool = False  # its prompt pieces may run on the side thread (`scheduler`)
    window: bool = False  # its sliding-window layers keep only their window (`windows`)
    made: LlamaContext | None = None

    @classmethod
    def open(
        cls,
        make: Callable[[], LlamaContext],
        cells: int,
        sequences: int,
        reserve: int,
        boundary: int = 1,
        drafts: bool = True,
        beside: bool = False,
        window: bool = False,
    ) -> Lane:
        lane = cls(make, cells, reserve=reserve, boundary=boundary, drafts=drafts, beside=beside, window=window)
        lane.slots = [Slot(seq_id=i, lane=lane) for i in range(sequences)]
        return lane

    def in_pieces(self, length: int) -> bool:
        """Whether prompt pieces evaluate a prompt of `length` tokens here (`block`), rather than decoding rows: all
        but a prompt shorter than a block. Which kernel computes a position then depends on the prompt alone."""
        return length >= self.block

    @property
    def context(self) -> LlamaContext:
        if self.made is None:
            self.made = self.make()
        return self.made

    def close(self) -> None:
        if self.made is not None:
            self.made.close()

    def free(self) -> list[Slot]:
        return [slot for slot in self.slots if slot.free]

    def status(self) -> LaneStatus:
        busy = [slot for slot in self.slots if not slot.free]
        return {
            # Whether its context computes with repacked weights (`repack`); None until the context is made.
            "repacked_weights": None if self.made is None else self.made.model.repacked,
            # Whether prompt pieces and decoding steps take kernels of their own (`kernels`); None until made.
            "kernels_by_pass": None if self.made is None else self.made.kernels is not None,
            # The cache's K and V types, as made (`kv_type` may fall back to q8_0: `open_lanes`); None until made.
            "kv_cache": None if self.made is None else f"{self.made.kv_type}/{self.made.v_type}",
            "slots": len(self.slots),
            "busy_slots": len(busy),
            "context_per_slot": self.cells,
            "cells": self.cells * len(self.slots),
            "cells_in_use": sum(len(slot.cache) for slot in busy),
            "cells_cached": sum(len(slot.cache) for slot in self.slots if slot.free),
        }


class LaneStatus(TypedDict):
    """A lane in `/health`."""

    repacked_weights: bool | None
    kernels_by_pass: bool | None
    kv_cache: str | None
    slots: int
    busy_slots: int
    context_per_slot: int
    cells: int
    cells_in_use: int
    cells_cached: int


@dataclass
class EngineStats:
    steps: int = 0
    prompt_tokens_evaluated: int = 0
    tokens_generated: int = 0
    aborted_steps: int = 0  # background steps stopped for an arriving interactive job, and run again
    prefix_copies: int = 0  # prompts started from a copy of another slot's cells
    pieces_beside: int = 0  # long prompts' pieces evaluated beside the short slots' steps (`long_prompt_beside`)
    drafted_tokens: int = 0  # guesses decoded beside a sequence's token (`drafts`)
    accepted_drafts: int = 0  # of those, the ones the sampler drew anyway
    decode_seconds: float = 0.0  # inside llama_decode
    step_seconds: float = 0.0  # whole steps (decode + batching + sampling + text)


def common_prefix(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i
