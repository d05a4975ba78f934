"""Which tokens go into the next `llama_decode`: the fairness rule between decoding and prefilling.

Every decoding sequence gets exactly one token in every step, so a stream is never stalled by someone
else's prompt. Prompts are evaluated first come, first served, up to `budget` prompt tokens per step: a burst of
new requests is evaluated within a step or two and starts decoding together, while a long prompt costs the running
streams at most `budget` tokens of work per step. Where a prompt is cut does not change what it leaves in the cache
(the kernels are batch-invariant: see `invariance`), so prompts are cut wherever the budget ends.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class PrefillNeed:
    key: int  # slot id
    pending: int  # prompt tokens still to evaluate


@dataclass(frozen=True, slots=True)
class StepPlan:
    decode: list[int]  # slot ids decoding one token
    prefill: list[tuple[int, int]]  # (slot id, tokens to evaluate this step)


def plan_step(decoding: list[int], prefilling: list[PrefillNeed], budget: int) -> StepPlan:
    """One token per decoding sequence, then prompt tokens in arrival order until `budget` is spent."""
    prefill: list[tuple[int, int]] = []
    for need in prefilling:
        if budget <= 0:
            break
        take = min(need.pending, budget)
        prefill.append((need.key, take))
        budget -= take
    return StepPlan(decode=list(decoding), prefill=prefill)
