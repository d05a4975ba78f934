"""Member choice: weighted least outstanding requests, skipping, prefix affinity that yields to load."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from tokenrelay.backends.upstream.health import Breaker, ProbeHealth
from tokenrelay.backends.upstream.router import Load, affinity_key, choose, prefix_key
from tokenrelay.config import PrefixAffinity
from tokenrelay.protocol.chat import ChatCompletionRequest

AFFINITY = PrefixAffinity(enabled=True, prefix_chars=64, max_load_gap=2)
OFF = PrefixAffinity()


@dataclass
class Fake:
    name: str
    weight: float = 1.0
    max_in_flight: int | None = None
    load: Load = field(default_factory=Load)
    breaker: Breaker = field(default_factory=lambda: Breaker(threshold=1, cooldown=60))
    health: ProbeHealth = field(default_factory=lambda: ProbeHealth(1))


def take(members: list[Fake], count: int, key: int | None = None, affinity: PrefixAffinity = OFF) -> Counter[str]:
    """Route `count` requests that all stay in flight, as the backend does."""
    picks: Counter[str] = Counter()
    for sequence in range(1, count + 1):
        member = choose(members, set(), key, affinity)
        assert member is not None
        member.load.in_flight += 1
        member.load.last_pick = sequence
        picks[member.name] += 1
    return picks


def test_outstanding_requests_spread_in_proportion_to_weight() -> None:
    members = [Fake("a", weight=2), Fake("b"), Fake("c")]
    assert take(members, 40) == {"a": 20, "b": 10, "c": 10}


def test_the_least_loaded_member_is_chosen() -> None:
    a, b = Fake("a"), Fake("b")
    a.load.in_flight = 3
    assert choose([a, b], set(), None, OFF) is b


def test_idle_members_take_turns() -> None:
    members = [Fake("a"), Fake("b"), Fake("c")]
    order = []
    for sequence in range(1, 7):
        member = choose(members, set(), None, OFF)
        member.load.last_pick = sequence  # requests that finish before the next arrives
        order.append(member.name)
    assert order == ["a", "b", "c", "a", "b", "c"]


def test_saturated_open_and_excluded_members_are_skipped() -> None:
    full, broken, tried, free = Fake("full", max_in_flight=2), Fake("broken"), Fake("tried"), Fake("free")
    full.load.in_flight = 2
    broken.breaker.failure()
    free.load.in_flight = 50
    assert choose([full, broken, tried, free], {"tried"}, None, OFF) is free
    free.max_in_flight = 50
    assert choose([full, broken, tried, free], {"tried"}, None, OFF) is None


def test_members_failing_probes_are_used_only_when_no_other_is_left() -> None:
    down, up = Fake("down"), Fake("up")
    down.health.record(False)
    up.load.in_flight = 10
    assert choose([down, up], set(), None, OFF) is up
    assert choose([down, up], {"up"}, None, OFF) is down


def test_a_long_shared_prefix_goes_to_one_member_and_different_prefixes_spread() -> None:
    members = [Fake(name) for name in "abcd"]
    system = "You are a helpful assistant. " * 4
    keys = [prefix_key(system + f"question {i}", AFFINITY) for i in range(20)]
    assert len(set(keys)) == 1  # only the first prefix_chars count
    assert len({choose(members, set(), keys[0], AFFINITY).name for _ in range(5)}) == 1
    spread = {choose(members, set(), prefix_key(f"{i:03d}" + system, AFFINITY), AFFINITY).name for i in range(40)}
    assert spread == {"a", "b", "c", "d"}


def test_short_prompts_and_disabled_affinity_have_no_key() -> None:
    assert prefix_key("short", AFFINITY) is None
    assert prefix_key("x" * 5000, OFF) is None


def test_affinity_yields_to_load() -> None:
    members = [Fake("a"), Fake("b")]
    key = prefix_key("p" * 100, AFFINITY)
    preferred = choose(members, set(), key, AFFINITY)
    other = next(m for m in members if m is not preferred)
    preferred.load.in_flight = 2
    assert choose(members, set(), key, AFFINITY) is preferred  # within the allowed gap
    preferred.load.in_flight = 3
    assert choose(members, set(), key, AFFINITY) is other


def test_affinity_survives_removing_another_member() -> None:
    members = [Fake(name) for name in "abcde"]
    keys = [prefix_key(f"{i:04d}" + "x" * 100, AFFINITY) for i in range(50)]
    before = {k: choose(members, set(), k, AFFINITY).name for k in keys}
    gone = "c"
    after = {k: choose([m for m in members if m.name != gone], set(), k, AFFINITY).name for k in keys}
    assert all(after[k] == before[k] for k in keys if before[k] != gone)


def test_a_prompt_cache_key_keeps_a_conversation_on_one_member_whatever_its_prompt() -> None:
    """OpenAI's `prompt_cache_key` (Codex sends its session id): the turns of one session share a node's cache."""
    members = [Fake(name) for name in "abcd"]

    def chat(key: str | None, text: str) -> ChatCompletionRequest:
        hint = {"prompt_cache_key": key} if key is not None else {}
        return ChatCompletionRequest.model_validate(
            {"model": "m", "messages": [{"role": "user", "content": text}], **hint}
        )

    session = {affinity_key(chat("session-1", f"turn {i}"), OFF) for i in range(10)}
    assert len(session) == 1 and None not in session
    chosen = {choose(members, set(), affinity_key(chat(f"session-{i}", "same"), OFF), OFF).name for i in range(40)}
    assert chosen == {"a", "b", "c", "d"}
    assert affinity_key(chat(None, "x" * 5000), OFF) is None
