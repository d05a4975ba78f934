"""A key's requests- and tokens-per-minute buckets kept outside the database: in Redis, shared by every replica,
or in this process while Redis does not answer.

Why Redis for the rates but the database for budgets: a budget is durable, prepaid state, settled in the same
transaction as the request's ledger row, so it belongs in the database. A rate bucket forgets itself within a
minute and is touched by every request of a limited key: Redis keeps it shared across replicas with one
in-memory script per request, without a database round trip for keys that have rate limits only.

Why local counting when Redis is down: a rate limit is protection, not money, so refusing every request (or
answering 5xx) would be worse than each replica counting on its own for a while.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Protocol, TypeVar

log = logging.getLogger(__name__)

T = TypeVar("T")

RETRY_SECONDS = 5.0  # how long a replica counts locally before asking Redis again


@dataclass(frozen=True, slots=True)
class RateAsk:
    """One admission: a request into the rpm bucket and `tokens` into the tpm bucket (None: no such limit)."""

    key_id: str
    rpm: int | None
    tpm: int | None
    tokens: int


@dataclass(frozen=True, slots=True)
class Levels:
    """Both buckets' levels as a refused take found them, drained to `at`: read by `limiter.refusal()` like a
    counters row."""

    rpm_level: float
    tpm_level: float
    at: float

    @property
    def rpm_at(self) -> float:
        return self.at

    @property
    def tpm_at(self) -> float:
        return self.at


class RateBuckets(Protocol):
    async def take(self, ask: RateAsk) -> Levels | None:
        """Fill both buckets if both have room (None), else change nothing and say how full they are."""

    async def give_back(self, key_id: str, requests: int, tokens: int) -> None:
        """Lower the buckets (never below empty): a take undone, or tokens a request did not use."""

    async def close(self) -> None: ...


class LocalBuckets(Protocol):
    def take(self, ask: RateAsk) -> Levels | None: ...

    def give_back(self, key_id: str, requests: int, tokens: int) -> None: ...


class FailoverRates:
    """`shared` (Redis) while it answers; `local` (this process) from its first error until it answers again.

    A give-back goes to whichever is in use at the time, so one taken just before Redis went down or came back
    lands in the other store: at worst a key gets one request's tokens of extra room, once.
    """

    def __init__(
        self,
        shared: RateBuckets,
        local: LocalBuckets,
        where: str,
        retry_seconds: float = RETRY_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.shared, self.local, self.where = shared, local, where
        self.retry_seconds, self.clock = retry_seconds, clock
        self._retry_at: float | None = None  # while Redis is down: when the next request may try it again

    @property
    def down(self) -> bool:
        return self._retry_at is not None

    async def take(self, ask: RateAsk) -> Levels | None:
        answered, levels = await self._ask_shared(lambda: self.shared.take(ask))
        return levels if answered else self.local.take(ask)

    async def give_back(self, key_id: str, requests: int, tokens: int) -> None:
        answered, _ = await self._ask_shared(lambda: self.shared.give_back(key_id, requests, tokens))
        if not answered:
            self.local.give_back(key_id, requests, tokens)

    async def _ask_shared(self, ask: Callable[[], Awaitable[T]]) -> tuple[bool, T | None]:
        """(True, Redis's answer), or (False, None) when Redis is not asked now or fails: count locally."""
        if not self._try_shared():
            return False, None
        try:
            answer = await ask()
        except Exception as exc:  # any failure of Redis (refused, timed out, script error) counts locally
            self._failed(exc)
            return False, None
        self._answered()
        return True, answer

    async def close(self) -> None:
        await self.shared.close()

    def _try_shared(self) -> bool:
        """Whether to ask Redis now: always while it answers; while down, one request every `retry_seconds`
        (the others count locally meanwhile rather than each wait for a timeout)."""
        if self._retry_at is None:
            return True
        now = self.clock()
        if now < self._retry_at:
            return False
        self._retry_at = now + self.retry_seconds
        return True

    def _failed(self, exc: Exception) -> None:
        if self._retry_at is None:
            log.warning(
                "rate limits: Redis at %s is not answering (%s: %s); this replica counts requests and tokens per "
                "minute on its own until it answers again (tried every %g s)",
                self.where,
                type(exc).__name__,
                exc,
                self.retry_seconds,
            )
        self._retry_at = self.clock() + self.retry_seconds

    def _answered(self) -> None:
        if self._retry_at is not None:
            log.warning("rate limits: Redis at %s answers again; requests and tokens per minute are shared", self.where)
        self._retry_at = None
