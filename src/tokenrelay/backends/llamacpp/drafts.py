"""Draft tokens by prompt lookup: guesses of what a sequence says next, taken from what it has said before.

A decoding sequence whose last few tokens appeared earlier in its context (its prompt or its own output) is
guessed to go on as it did then. The scheduler decodes those guesses in the same step as the sequence's token and
keeps each one the sampler then draws anyway (`Scheduler._sample_run`); the first wrong one and everything after
it are dropped. Nothing in the output changes: a row's logits are the same whether it is decoded alone or beside
others (the kernels are batch-invariant, see `invariance`), and the sampler draws from the rows one at a time, in
order, exactly as it would have over several steps. What changes is how many steps a run of repeated text takes.
"""

from __future__ import annotations

from dataclasses import dataclass

MATCH = 3  # tokens that must repeat; fewer guess more often and more of the guesses are wrong
LOOKBACK = 4096  # tokens searched back from the end: a bound on the search's cost per step in a long context


def lookup_draft(history: list[int], count: int, match: int = MATCH) -> list[int]:
    """Up to `count` tokens that followed the latest earlier occurrence of `history`'s last `match` tokens."""
    if count <= 0 or len(history) <= match:
        return []
    tail = history[-match:]
    last = tail[-1]
    first = max(match - 1, len(history) - LOOKBACK)
    for end in range(len(history) - 2, first - 1, -1):  # `end`: where an earlier occurrence would end
        if history[end] == last and history[end - match + 1 : end + 1] == tail:
            return history[end + 1 : end + 1 + count]
    return []


UNTRIED_ROW = 0.1  # a row count's cost before any step had it: a tenth of a one-row step per extra row (optimistic,
# so that it is tried once and then known)
COST_WEIGHT = 0.1  # a new step's weight in its row count's moving average


@dataclass
class Odds:
    """How often one sequence's guesses have been right: text that repeats keeps being guessed, text that does not
    soon stops paying for rows."""

    right: int = 0
    checked: int = 0

    @property
    def rate(self) -> float:
        return (self.right + 1) / (self.checked + 2)  # one half before any guess


class DraftCosts:
    """What a step of a few rows costs on this model and machine (a moving average per row count, from the steps
    run), and so how many guesses are worth their rows."""

    def __init__(self, most_rows: int) -> None:
        self.most_rows = most_rows
        self.seconds: dict[int, float] = {}

    def observe(self, rows: int, seconds: float) -> None:
        if rows <= self.most_rows:
            known = self.seconds.get(rows)
            self.seconds[rows] = seconds if known is None else known + COST_WEIGHT * (seconds - known)

    def cost(self, rows: int) -> float:
        known = self.seconds.get(rows)
        if known is not None:
            return known
        # Before any one-row step (the first steps may be prompts), the cheapest step seen stands in for one.
        one_row = self.seconds.get(1) or min(self.seconds.values(), default=1.0)
        return one_row * (1 + UNTRIED_ROW * (rows - 1))

    def worth(self, rate: float, width: int, rows: int, limit: int) -> int:
        """How many guesses (up to `limit`) a sequence should add to a step of `rows` rows, `width` of them without
        guesses: each right one saves the sequence its share of such a step, and the k-th is checked only if the
        ones before it were right (`rate` each); they cost what `k` more rows add to the step."""
        share = self.cost(width) / width
        best, best_gain, expected = 0, 0.0, 0.0
        for k in range(1, limit + 1):
            expected += rate**k
            gain = expected * share - (self.cost(rows + k) - self.cost(rows))
            if gain > best_gain:
                best, best_gain = k, gain
        return best
