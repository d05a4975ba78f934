"""Keys against a real server, on SQLite and on PostgreSQL: who may call what, limits, and the usage report."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta
from datetime import time as dtime
from pathlib import Path

import httpx
import openai
import pytest
from accounting_support import FAST_CACHE, cli, counters, create_key, ledger_rows, postgres_database, sqlite_url
from servers import DEFAULT_MODEL, Server, start_server

from tokenrelay.limits.cost import prompt_bound
from tokenrelay.protocol.chat import ChatCompletionRequest
from tokenrelay.protocol.completions import CompletionRequest

ADMIN_ENV_KEY = "operator-secret-for-tests"


@dataclass
class Deployment:
    server: Server
    url: str
    keys: dict[str, str]

    def client(self, key: str) -> openai.OpenAI:
        return self.server.client(api_key=self.keys.get(key, key))

    def http(self, key: str | None = None) -> httpx.Client:
        headers = {} if key is None else {"Authorization": f"Bearer {self.keys.get(key, key)}"}
        return self.server.http(headers=headers)


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def deployment(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    tmp = tmp_path_factory.mktemp(f"keys-{request.param}")
    with _database(request.param, tmp) as url:
        # Two keys through the CLI before the server starts (so it starts locked), the rest through the admin API.
        keys = {"plain": create_key(url, "plain"), "admin": create_key(url, "ops", "--admin")}
        env = {**FAST_CACHE, "TOKENRELAY_ADMIN_KEY": ADMIN_ENV_KEY}
        server = start_server(tmp, "--database-url", url, env=env)
        try:
            deployment = Deployment(server, url, keys)
            for name, spec in MORE_KEYS.items():
                keys[name] = _create(deployment, {"name": name, **spec})
            yield deployment
        finally:
            server.stop()


MORE_KEYS: dict[str, dict[str, object]] = {
    "other-models": {"models": ["some-other-model"]},
    "this-model": {"models": [DEFAULT_MODEL, "some-other-model"]},
    "rpm": {"rpm": 2},
    "tpm": {"tpm": 300},
    "budget": {"budget_tokens": 30},
}


def _create(deployment: Deployment, spec: dict[str, object]) -> str:
    with deployment.http("admin") as admin:
        response = admin.post("/admin/keys", json=spec)
    assert response.status_code == 201, response.text
    return response.json()["key"]


def _database(kind: str, tmp: Path) -> object:
    if kind == "postgresql":
        return postgres_database()
    from contextlib import nullcontext

    return nullcontext(sqlite_url(tmp))


def complete(client: openai.OpenAI, **extra: object) -> openai.types.Completion:
    body = {"model": DEFAULT_MODEL, "prompt": "Hello", "max_tokens": 2, "temperature": 0, **extra}
    return client.completions.create(**body)


def expect_error(kind: type[openai.APIStatusError], code: str, call: object) -> openai.APIStatusError:
    with pytest.raises(kind) as caught:
        call()
    assert caught.value.code == code, caught.value.body
    return caught.value


# Who may call -------------------------------------------------------------------------------------
def test_missing_key_is_401_before_the_body_is_read(deployment: Deployment) -> None:
    with deployment.http() as http:
        for path, body in (("/v1/completions", b"{not json"), ("/v1/chat/completions", b""), ("/v1/nowhere", b"{}")):
            response = http.post(path, content=body)
            assert response.status_code == 401, (path, response.text)
            error = response.json()["error"]
            assert (error["type"], error["code"]) == ("invalid_request_error", "invalid_api_key")
        assert http.get("/v1/models").status_code == 401
        assert http.get("/health").status_code == 200  # probes need no key


@pytest.mark.parametrize(
    "header",
    [
        "Basic dXNlcjpwYXNz",
        "Bearer",
        "Bearer x",
        "bearer  tr-",
        "tr-not-even-a-scheme",
        "Bearer tr-" + "x" * 43,
        "Bearer sk-abc",
    ],
)
def test_malformed_and_wrong_keys_are_401(deployment: Deployment, header: str) -> None:
    with deployment.server.http(headers={"Authorization": header}) as http:
        response = http.post("/v1/completions", content=b"{broken")
    assert response.status_code == 401
    assert response.json()["error"]["code"] == "invalid_api_key"


def test_wrong_key_with_the_sdk(deployment: Deployment) -> None:
    wrong = deployment.keys["plain"][:-4] + "AAAA"
    expect_error(openai.AuthenticationError, "invalid_api_key", lambda: complete(deployment.client(wrong)))


def test_valid_key_is_served_and_accounted(deployment: Deployment) -> None:
    reply = complete(deployment.client("plain"), user="alice")
    assert reply.usage.completion_tokens == 2
    rows = _rows_for(deployment, "plain", expect=1)
    row = rows[-1]
    assert (row["endpoint"], row["model"], row["status"], row["user"]) == ("completions", DEFAULT_MODEL, 200, "alice")
    assert (row["prompt_tokens"], row["completion_tokens"]) == (reply.usage.prompt_tokens, 2)
    assert row["request_id"] in reply.id and row["backend"] == "llama.cpp" and row["finish_reasons"] == "length"
    assert row["latency_ms"] > 0 and row["ttft_ms"] is not None and not row["streamed"]


def test_revoked_key_stops_working_within_seconds(deployment: Deployment) -> None:
    with deployment.http("admin") as admin:
        created = admin.post("/admin/keys", json={"name": "short-lived"})
        assert created.status_code == 201
        secret = created.json()["key"]
        assert complete(deployment.client(secret)).usage.completion_tokens == 2
        revoked = admin.delete("/admin/keys/short-lived")
        assert revoked.status_code == 200 and revoked.json()["revoked_at"] is not None
    until_refused(deployment, secret)


def test_expired_key_is_401(deployment: Deployment) -> None:
    with deployment.http("admin") as admin:
        secret = admin.post("/admin/keys", json={"name": "expiring", "expires": "3s"}).json()["key"]
    assert complete(deployment.client(secret)).usage.completion_tokens == 2
    time.sleep(3.2)
    expect_error(openai.AuthenticationError, "invalid_api_key", lambda: complete(deployment.client(secret)))


def test_key_limited_to_other_models(deployment: Deployment) -> None:
    client = deployment.client("other-models")
    assert [m.id for m in client.models.list()] == []
    expect_error(openai.NotFoundError, "model_not_found", lambda: complete(client))
    expect_error(openai.NotFoundError, "model_not_found", lambda: client.models.retrieve(DEFAULT_MODEL))
    allowed = deployment.client("this-model")
    assert [m.id for m in allowed.models.list()] == [DEFAULT_MODEL]
    assert complete(allowed).usage.completion_tokens == 2


def test_tokenizer_endpoints_need_a_key_for_the_model(deployment: Deployment) -> None:
    body = {"model": DEFAULT_MODEL, "prompt": "Hello"}
    with deployment.http() as http:
        assert http.post("/tokenize", json=body).json()["error"]["code"] == "invalid_api_key"
        assert http.post("/detokenize", json={"model": DEFAULT_MODEL, "tokens": [2]}).status_code == 401
    with deployment.http("other-models") as http:
        assert http.post("/tokenize", json=body).json()["error"]["code"] == "model_not_found"
    with deployment.http("this-model") as http:
        assert http.post("/tokenize", json=body).json()["count"] == 1


def test_admin_endpoints_need_an_admin_key(deployment: Deployment) -> None:
    with deployment.http() as anonymous:
        assert anonymous.get("/admin/keys").status_code == 401
    with deployment.http("plain") as ordinary:
        response = ordinary.get("/admin/keys")
        assert response.status_code == 403 and response.json()["error"]["code"] == "permission_denied"
        assert ordinary.post("/admin/keys", json={"name": "sneaky"}).status_code == 403
        assert ordinary.get("/admin/usage").status_code == 403
    for admin_key in (deployment.keys["admin"], ADMIN_ENV_KEY):
        with deployment.http(admin_key) as admin:
            listed = admin.get("/admin/keys").json()["data"]
            assert {"plain", "ops", "rpm"} <= {k["name"] for k in listed}
            assert all("key" not in k and "secret_hash" not in k for k in listed)


def test_admin_api_validates_new_keys(deployment: Deployment) -> None:
    with deployment.http("admin") as admin:
        assert admin.post("/admin/keys", json={"name": "plain"}).status_code == 409
        bad = admin.post("/admin/keys", json={"name": "x", "rpm": 0})
        assert bad.status_code == 400 and bad.json()["error"]["param"] == "rpm"
        assert admin.post("/admin/keys", json={"name": "y", "expires": "yesterday"}).status_code == 400
        # Limits beyond what the ledger's columns hold are refused, not a server error.
        for field, value in (("tpm", 2**31), ("budget_tokens", 2**63), ("budget_cost", "1" * 13)):
            too_big = admin.post("/admin/keys", json={"name": "z", field: value})
            assert too_big.status_code == 400 and too_big.json()["error"]["param"] == field
        for field, value in (("budget_cost", -1), ("budget_cost", "lots"), ("budget_period", "yearly")):
            bad = admin.post("/admin/keys", json={"name": "w", field: value})
            assert bad.status_code == 400 and bad.json()["error"]["param"] == field, bad.text
        assert admin.delete("/admin/keys/no-such-key").status_code == 404


def test_the_cli_makes_a_periodic_money_budget_and_lists_its_spend_and_reset(deployment: Deployment) -> None:
    cli("keys", "create", "--name", "weekly", "--budget-cost", "2.5", "--budget-period", "weekly", url=deployment.url)
    listed = json.loads(cli("keys", "list", "--json", url=deployment.url).stdout)
    weekly = next(k for k in listed if k["name"] == "weekly")
    assert (weekly["budget_cost"], weekly["cost_used"], weekly["budget_period"]) == ("2.500000", "0.000000", "weekly")
    resets = datetime.fromisoformat(weekly["resets_at"].rstrip("Z"))
    # The next Monday 00:00 UTC: from a moment to a week away (a day off on a Sunday, so not by whole days).
    assert resets.weekday() == 0 and resets.time() == dtime(0)
    assert timedelta(0) < resets - datetime.utcnow() <= timedelta(days=7)
    table = cli("keys", "list", url=deployment.url).stdout
    assert "weekly" in table and "2.500000" in table
    refused = cli("keys", "create", "--name", "neg", "--budget-cost", "-3", url=deployment.url, check=False)
    assert refused.returncode != 0 and "budget_cost" in refused.stderr + refused.stdout


def test_rotation_replaces_the_secret(deployment: Deployment) -> None:
    with deployment.http("admin") as admin:
        old = admin.post("/admin/keys", json={"name": "rotating"}).json()
        new = admin.post("/admin/keys/rotating/rotate").json()
    assert new["id"] == old["id"] and new["key"] != old["key"] and new["prefix"] == new["key"][:11]
    assert complete(deployment.client(new["key"])).usage.completion_tokens == 2
    expect_error(openai.AuthenticationError, "invalid_api_key", lambda: complete(deployment.client(old["key"])))


def until_refused(deployment: Deployment, secret: str) -> None:
    """A key's caller is refused once every replica's key cache has expired (`FAST_CACHE`)."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            complete(deployment.client(secret))
        except openai.AuthenticationError as exc:
            assert exc.code == "invalid_api_key"
            return
        time.sleep(0.2)
    pytest.fail("a key was still accepted after 10 s")


def test_the_cli_rotates_and_revokes_a_key_a_running_server_honours(deployment: Deployment) -> None:
    old = cli("keys", "create", "--name", "cli-managed", "--json", url=deployment.url)
    created = json.loads(old.stdout)
    assert complete(deployment.client(created["key"])).usage.completion_tokens == 2
    rotated = json.loads(cli("keys", "rotate", "cli-managed", "--json", url=deployment.url).stdout)
    assert rotated["id"] == created["id"] and rotated["key"] != created["key"]
    until_refused(deployment, created["key"])
    assert complete(deployment.client(rotated["key"])).usage.completion_tokens == 2
    revoked = json.loads(cli("keys", "revoke", "cli-managed", "--json", url=deployment.url).stdout)
    assert revoked["revoked_at"] is not None
    until_refused(deployment, rotated["key"])
    listed = json.loads(cli("keys", "list", "--json", url=deployment.url).stdout)
    assert all(created["key"] not in json.dumps(k) and rotated["key"] not in json.dumps(k) for k in listed)


# Limits -------------------------------------------------------------------------------------------
def test_requests_per_minute(deployment: Deployment) -> None:
    client = deployment.client("rpm")
    complete(client)
    complete(client)
    error = expect_error(openai.RateLimitError, "rate_limit_exceeded", lambda: complete(client))
    assert 1 <= int(error.response.headers["retry-after"]) <= 60
    assert error.body["type"] == "rate_limit_error"


def test_tokens_per_minute(deployment: Deployment) -> None:
    client = deployment.client("tpm")
    too_big = expect_error(openai.RateLimitError, "rate_limit_exceeded", lambda: complete(client, max_tokens=400))
    assert "300 tokens per minute" in too_big.message
    # A stream in flight holds its worst case ("Hello": 7 prompt + 190 completion tokens) in the bucket,
    # so a second such request does not fit in 300 until it ends.
    stream = complete(client, max_tokens=190, stream=True)
    next(iter(stream))
    try:
        refused = expect_error(openai.RateLimitError, "rate_limit_exceeded", lambda: complete(client, max_tokens=190))
        assert int(refused.response.headers["retry-after"]) >= 1
    finally:
        stream.close()
    assert complete(client, max_tokens=2).usage.completion_tokens == 2  # small requests still fit


def test_budget_is_spent_exactly_and_never_overspent(deployment: Deployment) -> None:
    client = deployment.client("budget")
    served, requests = 0, 0
    for requests in range(1, 31):  # noqa: B007 (the count is used after the loop)
        try:
            served += complete(client).usage.total_tokens
        except openai.RateLimitError as exc:
            assert exc.code == "insufficient_quota" and exc.body["type"] == "insufficient_quota"
            break
    else:
        pytest.fail("a 30-token budget served 30 requests")
    rows = _rows_for(deployment, "budget", expect=requests)  # the refused request has its row too
    assert [r["status"] for r in rows] == [200] * (requests - 1) + [429]
    state = counters(deployment.url, "budget")
    assert state["budget_used"] == served <= 30
    assert state["budget_reserved"] == 0
    # Refused only when even this request's worst case ("Hello": 7 prompt + 2 completion tokens) did not fit:
    # back-to-back requests do not trip over the settlement of the one before.
    assert state["budget_used"] > 30 - 9


def test_reservation_bounds_the_real_prompt(deployment: Deployment) -> None:
    """The admission bound must never be below what the tokenizer really produced."""
    client = deployment.client("plain")
    texts = ["Hello", "naïve café ünïcödé — ✓ 🧪🧪", "x" * 300, "日本語のテキスト"]
    for text in texts:
        body = {"model": DEFAULT_MODEL, "prompt": text, "max_tokens": 1}
        reply = client.completions.create(**body)
        assert reply.usage.prompt_tokens <= prompt_bound(CompletionRequest.model_validate(body))
        messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": text}]
        chat_body = {"model": DEFAULT_MODEL, "messages": messages, "max_tokens": 1}
        chat = client.chat.completions.create(**chat_body)
        assert chat.usage.prompt_tokens <= prompt_bound(ChatCompletionRequest.model_validate(chat_body))
    # Tools, and a conversation with a call written into it: the template is told how to call, and shown the call.
    parameters = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
    tool = {"type": "function", "function": {"name": "get_weather", "description": "", "parameters": parameters}}
    call = {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}}
    called = [
        {"role": "user", "content": "Weather in Oslo?"},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c1", "content": "Snow."},
    ]
    tool_body = {"model": DEFAULT_MODEL, "messages": called, "tools": [tool], "max_tokens": 1}
    answered = client.chat.completions.create(**tool_body)
    assert answered.usage.prompt_tokens <= prompt_bound(ChatCompletionRequest.model_validate(tool_body))


# Usage report -------------------------------------------------------------------------------------
def test_usage_report_cli_and_admin_api_agree(deployment: Deployment) -> None:
    complete(deployment.client("this-model"))
    with deployment.http("admin") as admin:
        api = admin.get("/admin/usage", params={"by": "key"}).json()  # also flushes this server's ledger
        by_model = admin.get("/admin/usage", params={"by": "model", "key": "this-model", "since": "2020-01-01"}).json()
        assert admin.get("/admin/usage", params={"by": "colour"}).status_code == 400
    report = json.loads(cli("usage", "--by", "key", "--json", url=deployment.url).stdout)
    assert report["totals"] == api["totals"] and report["groups"] == api["groups"]
    rows = ledger_rows(deployment.url)
    assert api["totals"]["requests"] == len(rows)
    assert api["totals"]["completion_tokens"] == sum(r["completion_tokens"] for r in rows)
    assert by_model["groups"][0]["model"] == DEFAULT_MODEL
    mine = [r for r in rows if r["key_name"] == "this-model"]
    assert by_model["totals"]["requests"] == len(mine)
    table = cli("usage", "--key", "this-model", "--by", "day", url=deployment.url).stdout
    assert "total" in table and str(len(mine)) in table
    listed = json.loads(cli("keys", "list", "--json", url=deployment.url).stdout)
    assert next(k for k in listed if k["name"] == "this-model")["last_used_at"] is not None


def _rows_for(deployment: Deployment, key_name: str, expect: int) -> list[dict[str, object]]:
    """The ledger rows of a key, once at least `expect` of them are written (the ledger writes in batches)."""
    deadline = time.monotonic() + 10
    while True:
        rows = [r for r in ledger_rows(deployment.url) if r["key_name"] == key_name]
        if len(rows) >= expect or time.monotonic() > deadline:
            return rows
        time.sleep(0.1)
