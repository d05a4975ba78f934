"""Which member takes a request: weighted least outstanding requests, with optional prefix affinity.

A member's cost is its in-flight count after taking the request, divided by its weight; ties go to the
member chosen least recently, so idle members take turns. Members whose breaker is open or that are at
`max_in_flight` are skipped. Members failing active probes are skipped too, unless no member passes them:
a probe can be wrong (a node without the probe path) where requests still work, and the breaker still
guards each member.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol, TypeVar

from tokenrelay.backends.upstream.health import Breaker, ProbeHealth
from tokenrelay.backends.upstream.metering import prompt_text
from tokenrelay.config import PrefixAffinity
from tokenrelay.protocol.common import GenerationRequest


@dataclass
class Load:
    in_flight: int = 0
    requests: int = 0
    failures: int = 0
    last_pick: int = 0  # router sequence number of the last time this member was chosen
    latency_ewma: float | None = None  # seconds to the first event

    def observe_latency(self, seconds: float, alpha: float = 0.2) -> None:
        previous = self.latency_ewma
        self.latency_ewma = seconds if previous is None else previous + alpha * (seconds - previous)


class Routable(Protocol):
    name: str
    weight: float
    max_in_flight: int | None
    load: Load
    breaker: Breaker
    health: ProbeHealth


M = TypeVar("M", bound=Routable)


def cost(member: Routable) -> float:
    return (member.load.in_flight + 1) / member.weight


def available(members: Iterable[M], exclude: set[str]) -> list[M]:
    usable = [m for m in members if m.name not in exclude and m.breaker.allows() and not _saturated(m)]
    return [m for m in usable if m.health.healthy] or usable


def choose(members: Sequence[M], exclude: set[str], prefix_key: int | None, affinity: PrefixAffinity) -> M | None:
    candidates = available(members, exclude)
    if not candidates:
        return None
    least = min(candidates, key=lambda m: (cost(m), m.load.last_pick))
    if prefix_key is None:
        return least
    preferred = max(candidates, key=lambda m: rendezvous_score(prefix_key, m))
    # Affinity yields to load: the KV cache a busy node holds is worth less than an idle node's time.
    return preferred if cost(preferred) - cost(least) <= affinity.max_load_gap else least


def rendezvous_score(key: int, member: Routable) -> float:
    """Weighted rendezvous hashing: each key ranks members stably, and removing one moves only its keys."""
    digest = hashlib.blake2b(f"{key}:{member.name}".encode(), digest_size=8).digest()
    unit = (int.from_bytes(digest, "big") + 1) / (2**64 + 1)  # in (0, 1)
    return -member.weight / math.log(unit)


def affinity_key(request: GenerationRequest, affinity: PrefixAffinity) -> int | None:
    """The key that keeps related requests on one node: the client's own `prompt_cache_key` (OpenAI's hint for
    exactly this), else, with prefix affinity on, the prompt's first `prefix_chars` characters."""
    hint = (request.model_extra or {}).get("prompt_cache_key")
    if isinstance(hint, str) and hint:
        return _hashed(hint)
    return prefix_key(prompt_text(request), affinity) if affinity.enabled else None


def prefix_key(prompt: str, affinity: PrefixAffinity) -> int | None:
    if not affinity.enabled or len(prompt) < affinity.prefix_chars:
        return None
    return _hashed(prompt[: affinity.prefix_chars])


def _hashed(text: str) -> int:
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "big")


def _saturated(member: Routable) -> bool:
    return member.max_in_flight is not None and member.load.in_flight >= member.max_in_flight
