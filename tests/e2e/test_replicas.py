"""Two server processes on one PostgreSQL: keys, revocations, rate limits and budgets are shared."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

import openai
import pytest
from accounting_support import FAST_CACHE, counters, create_key, ledger_rows, postgres_database
from replica_support import Replicas, completion_round
from servers import DEFAULT_MODEL, SHARED_CORES, Server, start_server


@pytest.fixture(scope="module")
def replicas(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Replicas]:
    tmp = tmp_path_factory.mktemp("replicas")
    with postgres_database() as url:
        admin = create_key(url, "ops", "--admin")
        a = start_server(tmp, "--database-url", url, env=FAST_CACHE | SHARED_CORES, wait=False)
        b = start_server(tmp, "--database-url", url, env=FAST_CACHE | SHARED_CORES)
        try:
            from servers import wait_ready

            wait_ready(a)
            yield Replicas(a, b, url, admin)
        finally:
            a.stop()
            b.stop()


def complete(server: Server, key: str, max_tokens: int = 2) -> openai.types.Completion:
    return server.client(api_key=key).completions.create(model=DEFAULT_MODEL, prompt="Hi", max_tokens=max_tokens)


def test_a_key_created_on_one_replica_works_on_the_other(replicas: Replicas) -> None:
    key = replicas.create(replicas.a, name="shared")
    assert complete(replicas.b, key).usage.completion_tokens == 2
    assert complete(replicas.a, key).usage.completion_tokens == 2


def test_a_revocation_on_one_replica_reaches_the_other_within_seconds(replicas: Replicas) -> None:
    key = replicas.create(replicas.a, name="to-revoke")
    complete(replicas.b, key)  # now cached on b
    with replicas.a.http(headers={"Authorization": f"Bearer {replicas.admin}"}) as http:
        assert http.delete("/admin/keys/to-revoke").status_code == 200
    revoked_at = time.monotonic()
    while time.monotonic() - revoked_at < 10:
        try:
            complete(replicas.b, key, max_tokens=1)
        except openai.AuthenticationError:
            break
        time.sleep(0.1)
    else:
        pytest.fail("replica b still accepted the revoked key after 10 s")
    assert time.monotonic() - revoked_at < 5  # the cache lives 1 s in these tests


def test_requests_per_minute_are_counted_across_replicas(replicas: Replicas) -> None:
    key = replicas.create(replicas.a, name="rpm", rpm=3)
    complete(replicas.a, key, 1)
    complete(replicas.b, key, 1)
    complete(replicas.a, key, 1)
    with pytest.raises(openai.RateLimitError) as caught:
        complete(replicas.b, key, 1)
    assert caught.value.code == "rate_limit_exceeded" and "retry-after" in caught.value.response.headers


def test_a_budget_is_shared_and_never_overspent(replicas: Replicas) -> None:
    key = replicas.create(replicas.a, name="budget", budget_tokens=120)
    outcomes: list[int | str] = []
    for _ in range(10):
        this_round = asyncio.run(completion_round([replicas.a, replicas.b], key, 24, _tokens))
        outcomes += this_round
        _wait_for_rows(replicas.url, "budget", len(outcomes))  # every reservation of the round is settled
        if all(isinstance(o, str) for o in this_round):
            break
    else:
        pytest.fail("the budget was not exhausted")
    served = [o for o in outcomes if isinstance(o, int)]
    assert served and {o for o in outcomes if isinstance(o, str)} == {"insufficient_quota"}
    rows = [r for r in ledger_rows(replicas.url) if r["key_name"] == "budget"]
    assert len(rows) == len(outcomes)
    state = counters(replicas.url, "budget")
    assert state["budget_reserved"] == 0
    assert state["budget_used"] == sum(served) <= 120
    assert state["budget_used"] > 120 - 8  # "Hi" with max_tokens 4 reserves 8: not even that was left


def _tokens(reply: openai.types.Completion) -> int:
    return reply.usage.total_tokens


def _wait_for_rows(url: str, key_name: str, count: int) -> None:
    deadline = time.monotonic() + 15
    while len([r for r in ledger_rows(url) if r["key_name"] == key_name]) < count:
        assert time.monotonic() < deadline, "ledger rows missing"
        time.sleep(0.1)
