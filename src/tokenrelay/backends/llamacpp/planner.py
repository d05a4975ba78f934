"""Which tokens go into the next `llama_decode`: the fairness rule between decoding and prefilling.

Every decoding sequence gets exactly one token in every step, so a stream is never stalled by someone
else's prompt. Prompts are evaluated first come, first served, up to `budget` prompt tokens per step: a burst of
new requests is evaluated within a step or two and starts decoding together, while a long prompt costs the running
streams at most `budget` tokens of work per step.

Where prompt pieces and decoding steps take kernels of their own (`kernels`), a prompt shorter than a block goes
with the decoding rows (its `tail`: the whole prompt), a longer one in prompt pieces of at least `unit` rows, the last
of which takes the prompt's rest, over the budget if need be (by less than a unit): which kernel computes a position
then depends on the prompt alone, not on where the budget ran out (`Lane.block`, `Lane.unit`).
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class PrefillNeed:
    key: int  # slot id
    pending: int  # prompt tokens still to evaluate
    tail: int = 0  # of those, the ones that go with the decoding rows, after the others
    unit: int = 1  # the others are taken in multiples of this, the last piece with their rest


@dataclass(frozen=True, slots=True)
class StepPlan:
    decode: list[int]  # slot ids decoding one token
    prefill: list[tuple[int, int]]  # (slot id, tokens to evaluate this step) as prompt pieces
    tails: list[tuple[int, int]] = field(default_factory=list)  # (slot id, tokens) beside the decoding rows


def plan_step(decoding: list[int], prefilling: list[PrefillNeed], budget: int) -> StepPlan:
    """One token per decoding sequence, then prompt tokens in arrival order until `budget` is spent."""
    prefill: list[tuple[int, int]] = []
    tails: list[tuple[int, int]] = []
    for need in prefilling:
        if budget <= 0:
            break
        whole = need.pending - need.tail
        take = min(whole, budget) // need.unit * need.unit
        if whole - take < need.unit:  # the last piece, with the rest
            take = whole
        if take:
            prefill.append((need.key, take))
            budget -= take
        if take == whole and need.tail and budget > 0:
            tail = min(need.tail, budget)
            tails.append((need.key, tail))
            budget -= tail
    return StepPlan(decode=list(decoding), prefill=prefill, tails=tails)
