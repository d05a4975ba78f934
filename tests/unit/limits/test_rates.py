"""Rate buckets outside the database without Redis: the in-process buckets, and the switch to them (and back)
when Redis stops (and starts) answering, said once in the log each way."""

from __future__ import annotations

import asyncio
import logging

import pytest
from pydantic import ValidationError

from tokenrelay.cli.main import build_parser, overrides_from
from tokenrelay.config import load_settings
from tokenrelay.limits.local_rates import LocalRates
from tokenrelay.limits.rates import FailoverRates, Levels, RateAsk


class Clock:
    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


class FlakyShared:
    """Stands in for Redis: refuses connections while `down`, else admits everything."""

    def __init__(self) -> None:
        self.down = True
        self.takes = 0
        self.given: list[tuple[str, int, int]] = []

    async def take(self, ask: RateAsk) -> Levels | None:
        self._answer()
        self.takes += 1
        return None

    async def give_back(self, key_id: str, requests: int, tokens: int) -> None:
        self._answer()
        self.given.append((key_id, requests, tokens))

    async def close(self) -> None:
        pass

    def _answer(self) -> None:
        if self.down:
            raise ConnectionRefusedError("connection refused")


def test_local_buckets_allow_a_burst_then_drain_at_the_limit_per_minute() -> None:
    clock = Clock()
    rates = LocalRates(clock)
    ask = RateAsk("k", rpm=3, tpm=None, tokens=0)
    assert [rates.take(ask) for _ in range(3)] == [None, None, None]
    refused = rates.take(ask)
    assert refused is not None and refused.rpm_level == pytest.approx(3.0)
    clock.now += 20  # a third of a minute drains one request of three
    assert rates.take(ask) is None
    assert rates.take(ask) is not None


def test_local_tokens_per_minute_count_the_tokens_and_take_give_backs() -> None:
    rates = LocalRates(Clock())
    assert rates.take(RateAsk("k", rpm=None, tpm=100, tokens=60)) is None
    refused = rates.take(RateAsk("k", rpm=None, tpm=100, tokens=60))
    assert refused is not None and refused.tpm_level == pytest.approx(60.0)
    rates.give_back("k", 0, 50)  # the first request used 10 of its 60
    assert rates.take(RateAsk("k", rpm=None, tpm=100, tokens=60)) is None


def test_a_refused_take_changes_neither_bucket() -> None:
    rates = LocalRates(Clock())
    assert rates.take(RateAsk("k", rpm=2, tpm=100, tokens=90)) is None
    assert rates.take(RateAsk("k", rpm=2, tpm=100, tokens=20)) is not None  # the tokens do not fit
    assert rates.take(RateAsk("k", rpm=2, tpm=100, tokens=10)) is None  # so the request is still free


def test_idle_keys_are_forgotten() -> None:
    clock = Clock()
    rates = LocalRates(clock)
    rates.take(RateAsk("idle", rpm=1, tpm=None, tokens=0))
    clock.now += 120
    rates.take(RateAsk("other", rpm=1, tpm=None, tokens=0))
    assert list(rates._keys) == ["other"]


def test_redis_down_counts_locally_logs_once_and_comes_back(caplog: pytest.LogCaptureFixture) -> None:
    async def scenario() -> None:
        shared, local, clock = FlakyShared(), LocalRates(), Clock()
        rates = FailoverRates(shared, local, "redis://test", retry_seconds=5, clock=clock)
        ask = RateAsk("k", rpm=100, tpm=None, tokens=0)
        with caplog.at_level(logging.WARNING, logger="tokenrelay.limits.rates"):
            assert [await rates.take(ask) for _ in range(10)] == [None] * 10
            assert rates.down and local._keys["k"].rpm.level == pytest.approx(10.0, abs=0.01)
            clock.now += 6  # time to ask Redis again: still down, said no more
            assert await rates.take(ask) is None
            shared.down = False
            assert await rates.take(ask) is None  # not yet: the next try is 5 s after the last one
            assert shared.takes == 0
            clock.now += 6
            assert await rates.take(ask) is None
            await rates.give_back("k", 0, 5)
        assert shared.takes == 1 and shared.given == [("k", 0, 5)] and not rates.down
        messages = [r.getMessage() for r in caplog.records]
        assert len(messages) == 2, messages
        assert "not answering" in messages[0] and "ConnectionRefusedError" in messages[0]
        assert "answers again" in messages[1]

    asyncio.run(scenario())


def test_the_redis_url_comes_from_the_command_line_or_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    args = build_parser().parse_args(["serve", "--redis-url", "redis://127.0.0.1:6379/3"])
    assert load_settings(None, overrides_from(args, load_settings())).redis_url == "redis://127.0.0.1:6379/3"
    monkeypatch.setenv("TOKENRELAY_REDIS_URL", "redis://cache:6379/0")
    assert load_settings().redis_url == "redis://cache:6379/0"
    with pytest.raises(ValidationError, match="redis_url"):
        load_settings(None, {"redis_url": "127.0.0.1:6379"})
