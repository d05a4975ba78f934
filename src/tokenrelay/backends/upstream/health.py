"""Whether a member should get requests: a circuit breaker fed by request outcomes, and active probe results."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum


class BreakerState(StrEnum):
    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half_open"


@dataclass
class Breaker:
    """Opens after `threshold` consecutive failures; after `cooldown` seconds lets one trial request through.

    The trial's success closes it; its failure opens it for another cooldown.
    """

    threshold: int
    cooldown: float
    clock: Callable[[], float] = time.monotonic
    failures: int = 0
    opened_at: float | None = None
    trial: bool = False

    @property
    def state(self) -> BreakerState:
        if self.opened_at is None:
            return BreakerState.CLOSED
        if self.clock() - self.opened_at < self.cooldown:
            return BreakerState.OPEN
        return BreakerState.HALF_OPEN

    def allows(self) -> bool:
        state = self.state
        return state is BreakerState.CLOSED or (state is BreakerState.HALF_OPEN and not self.trial)

    def begin(self) -> None:
        if self.state is BreakerState.HALF_OPEN:
            self.trial = True

    def success(self) -> None:
        self.failures, self.opened_at, self.trial = 0, None, False

    def failure(self) -> None:
        self.failures += 1
        if self.trial or self.failures >= self.threshold:
            self.opened_at = self.clock()
        self.trial = False

    def abandon(self) -> None:
        """A request ended without a verdict (the client left): a trial slot is free again."""
        self.trial = False


@dataclass
class ProbeHealth:
    """Active probe results: down after `unhealthy_after` consecutive failed probes, up after one success."""

    unhealthy_after: int
    healthy: bool = True  # until probed: a node is trusted, and the breaker still guards it
    failed_probes: int = 0

    def record(self, ok: bool) -> None:
        if ok:
            self.failed_probes, self.healthy = 0, True
            return
        self.failed_probes += 1
        if self.failed_probes >= self.unhealthy_after:
            self.healthy = False
