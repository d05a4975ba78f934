"""Which tokens go into the next `llama_decode`: the fairness rule between decoding and prefilling.

Every decoding sequence gets exactly one token in every step, so a stream is never stalled by someone
else's prompt. Prompts are evaluated first come, first served, in pieces that sit at fixed positions
(multiples of `chunk` from the start of the prompt); a step takes at most `chunk` prompt tokens in all, so
several short prompts share one step (a burst of new requests starts decoding together instead of one per
step) while a long prompt still costs the running streams at most one chunk of work per step. A prompt is
evaluated in the same pieces whatever else is running, so that where prefixes are reused (in whole pieces)
the cache holds what evaluating the prompt from scratch would have put there.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class PrefillNeed:
    key: int  # slot id
    position: int  # next prompt position to evaluate
    pending: int  # prompt tokens still to evaluate


@dataclass(frozen=True, slots=True)
class StepPlan:
    decode: list[int]  # slot ids decoding one token
    prefill: list[tuple[int, int]]  # (slot id, tokens to evaluate this step)


def aligned_take(position: int, pending: int, chunk: int) -> int:
    """Tokens from `position` up to the next chunk boundary (or the end of the prompt)."""
    return min(pending, chunk - position % chunk)


def plan_step(decoding: list[int], prefilling: list[PrefillNeed], chunk: int) -> StepPlan:
    """One token per decoding sequence, then whole aligned prompt pieces in arrival order while they fit in
    `chunk` tokens (the first always fits). A piece is never cut further: the same prompt is evaluated in
    the same pieces whatever else is waiting."""
    prefill: list[tuple[int, int]] = []
    budget = chunk
    for need in prefilling:
        take = aligned_take(need.position, need.pending, chunk)
        if take > budget:
            break  # first come, first served: a later, smaller prompt does not overtake
        prefill.append((need.key, take))
        budget -= take
    return StepPlan(decode=list(decoding), prefill=prefill)


def aligned_prefix(shared: int, chunk: int) -> int:
    """The part of a shared prefix that may be reused: whole chunks only, so the rest is evaluated in the
    same pieces as it would be from scratch."""
    return shared - shared % chunk
