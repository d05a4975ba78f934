"""Rate buckets in this process: what a replica counts while Redis does not answer (`limits/rates.py`).

The same leaky buckets as the database's and Redis's (`limits/buckets.py`), each replica counting alone.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from tokenrelay.limits.buckets import drained
from tokenrelay.limits.rates import Levels, RateAsk

IDLE_SECONDS = 60.0  # a full bucket is empty again after a minute, so an idle key's entry can go


@dataclass(slots=True)
class Bucket:
    level: float = 0.0
    at: float = 0.0  # epoch seconds of the last change


@dataclass(slots=True)
class KeyBuckets:
    rpm: Bucket
    tpm: Bucket


class LocalRates:
    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self.clock = clock
        self._keys: dict[str, KeyBuckets] = {}
        self._pruned_at = 0.0

    def take(self, ask: RateAsk) -> Levels | None:
        now = self.clock()
        self._prune(now)
        buckets = self._keys.setdefault(ask.key_id, KeyBuckets(Bucket(at=now), Bucket(at=now)))
        rpm = _level(buckets.rpm, ask.rpm, now)
        tpm = _level(buckets.tpm, ask.tpm, now)
        if (ask.rpm is not None and rpm + 1 > ask.rpm) or (ask.tpm is not None and tpm + ask.tokens > ask.tpm):
            return Levels(rpm, tpm, now)
        buckets.rpm = Bucket(rpm + (ask.rpm is not None), now)
        buckets.tpm = Bucket(tpm + (ask.tokens if ask.tpm is not None else 0), now)
        return None

    def give_back(self, key_id: str, requests: int, tokens: int) -> None:
        buckets = self._keys.get(key_id)
        if buckets is None:  # idle long enough to be forgotten: already empty
            return
        buckets.rpm.level = max(0.0, buckets.rpm.level - requests)
        buckets.tpm.level = max(0.0, buckets.tpm.level - tokens)

    def _prune(self, now: float) -> None:
        if now - self._pruned_at < IDLE_SECONDS:
            return
        self._pruned_at = now
        idle = [key for key, b in self._keys.items() if now - max(b.rpm.at, b.tpm.at) > IDLE_SECONDS]
        for key in idle:
            del self._keys[key]


def _level(bucket: Bucket, per_minute: int | None, now: float) -> float:
    return 0.0 if per_minute is None else drained(bucket.level, bucket.at, per_minute, now)
