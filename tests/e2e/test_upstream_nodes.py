"""A gateway in front of real nodes on loopback: two tokenrelay instances (embedded engine) and llama-cpp-python's
own server, plus a scripted fault node. Tests run in file order; the last one kills node `a`.
"""

from __future__ import annotations

import json
import signal
import threading
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import yaml
from accounting_support import sqlite_url
from servers import Server, shared_data_dir, start_server, wait_ready
from third_party_node import start_llama_node, wait_models
from upstream_faultnode import FaultNode, fault_node

from tokenrelay.backends.llamacpp.default_model import ensure_default_model

ADMIN = "test-admin-key"
# Request ids (UUIDs, which the gateway passes on to nodes) to find a request in the servers' logs.
LONG_1, USAGE_B, USAGE_LLAMA, VIA_CHAT_1, KILLED_1 = (uuid.uuid4().hex for _ in range(5))
ENGINE = {"slots": 2, "ctx_per_slot": 512, "threads": 1}
NO_EOS = {"1": -100, "106": -100}  # Gemma's end-of-text and end-of-turn tokens: keep a stream going


@dataclass
class Fleet:
    a: Server
    b: Server
    llama: Server
    fault: FaultNode
    gateway: Server

    def http(self) -> httpx.Client:
        return self.gateway.http()

    def nodes(self, model: str) -> dict[str, dict[str, Any]]:
        status = httpx.get(f"{self.gateway.base_url}/health", timeout=10).json()["models"][model]
        return {node["name"]: node for node in status["nodes"]}


def upstream(server: Server | FaultNode, name: str, model: str = "gemma-3-270m", **extra: Any) -> dict[str, Any]:
    url = server.url if isinstance(server, FaultNode) else f"{server.base_url}/v1"
    return {"url": url, "name": name, "model": model, **extra}


def gateway_config(a: Server, b: Server, llama: Server, fault: FaultNode, gguf: Path) -> dict[str, Any]:
    node_a, node_b, node_llama = upstream(a, "a"), upstream(b, "b"), upstream(llama, "llama", "gemma-node")
    no_probes = {"health": {"probe_interval": 0}}
    return {
        "admin_key": ADMIN,
        "routing": no_probes,
        "models": [
            {"id": "trio", "upstreams": [node_a, node_b, node_llama], "routing": {"health": {"probe_interval": 0.5}}},
            {"id": "solo-a", "upstreams": [node_a]},
            {"id": "solo-b", "upstreams": [node_b]},
            {"id": "llama", "upstreams": [node_llama]},
            {"id": "pair", "upstreams": [node_a, node_b]},
            {
                "id": "flaky",
                "upstreams": [upstream(fault, "fault"), node_b],
                "routing": {"health": {"probe_interval": 0, "breaker_failures": 2, "breaker_cooldown": 3.0}},
            },
            {"id": "via-chat", "upstreams": [upstream(b, "b", completions_via_chat=True)]},
            {"id": "mixed", "path": str(gguf), "engine": ENGINE, "upstreams": [node_b]},
        ],
    }


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    tmp = tmp_path_factory.mktemp("fleet")
    gguf = ensure_default_model(shared_data_dir())
    engine = ("--slots", "2", "--ctx-size", "512", "--threads", "1")
    a, b = start_server(tmp, *engine, wait=False), start_server(tmp, *engine, wait=False)
    llama = start_llama_node(tmp, gguf, "gemma-node")
    started: list[Server] = [a, b, llama]
    try:
        with fault_node() as fault:
            wait_ready(a)
            wait_ready(b)
            wait_models(llama)
            config = tmp / "gateway.yaml"
            config.write_text(yaml.safe_dump(gateway_config(a, b, llama, fault, gguf)))
            # Its own database: registrations are kept there, and must not reach servers of other tests.
            gateway = start_server(tmp, "--config", str(config), "--database-url", sqlite_url(tmp))
            started.append(gateway)
            yield Fleet(a, b, llama, fault, gateway)
    finally:
        for server in started:
            server.stop()


# Helpers --------------------------------------------------------------------------------------------
def data_lines(response: httpx.Response) -> list[str]:
    return [line[6:] for line in response.iter_lines() if line.startswith("data: ")]


def stream_payloads(fleet: Fleet, path: str, body: dict[str, Any]) -> list[str]:
    with fleet.http() as http, http.stream("POST", path, json=body | {"stream": True}) as response:
        assert response.status_code == 200, response.read()
        payloads = data_lines(response)
    assert not [p for p in payloads if p.startswith('{"error"')], payloads
    return payloads


def request_line(server: Server, request_id: str, timeout: float = 10) -> dict[str, str]:
    """The server's one log line for a request, as fields."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for line in server.log_lines():
            if f"request_id={request_id} " in line:
                message = line.split("tokenrelay.requests: ", 1)[1]
                return dict(part.partition("=")[::2] for part in message.split(" "))
        time.sleep(0.1)
    raise AssertionError(f"no log line for {request_id}")


def short(fleet: Fleet, model: str, request_id: str | None = None) -> httpx.Response:
    headers = {"X-Request-ID": request_id} if request_id else {}
    body = {"model": model, "prompt": "One, two,", "max_tokens": 3, "temperature": 0}
    with fleet.http() as http:
        return http.post("/v1/completions", json=body, headers=headers)


# Tests ----------------------------------------------------------------------------------------------
def test_concurrent_requests_spread_over_all_nodes(fleet: Fleet) -> None:
    with ThreadPoolExecutor(6) as pool:
        responses = list(pool.map(lambda _: short(fleet, "trio"), range(6)))
    assert [r.status_code for r in responses] == [200] * 6
    assert {r.json()["model"] for r in responses} == {"trio"}
    assert {name: node["requests"] for name, node in fleet.nodes("trio").items()} == {"a": 2, "b": 2, "llama": 2}


def test_a_busy_node_is_avoided_and_a_closed_stream_is_cancelled_on_the_node(fleet: Fleet) -> None:
    long = {"model": "trio", "prompt": "Count:", "max_tokens": 400, "temperature": 0, "logit_bias": NO_EOS}
    before = {name: node["requests"] for name, node in fleet.nodes("trio").items()}
    with (
        fleet.http() as http,
        http.stream("POST", "/v1/completions", json=long | {"stream": True}, headers={"X-Request-ID": LONG_1}) as r,
    ):
        lines = r.iter_lines()  # kept: dropping the iterator would close the connection
        assert next(lines).startswith("data: ")
        busy = [name for name, node in fleet.nodes("trio").items() if node["in_flight"] == 1]
        assert len(busy) == 1
        for _ in range(4):
            assert short(fleet, "trio").status_code == 200
        counts = {name: node["requests"] - before[name] for name, node in fleet.nodes("trio").items()}
        assert counts[busy[0]] == 1  # only the long stream
        assert sorted(counts.values()) == [1, 2, 2]
    deadline = time.monotonic() + 5
    while fleet.nodes("trio")[busy[0]]["in_flight"] and time.monotonic() < deadline:
        time.sleep(0.05)
    assert fleet.nodes("trio")[busy[0]]["in_flight"] == 0
    node_server = {"a": fleet.a, "b": fleet.b}.get(busy[0])
    if node_server is not None:  # a tokenrelay node logs the cancelled request under the same request id
        line = request_line(node_server, LONG_1)
        assert line["status"] == "499"
        assert int(line["completion_tokens"]) < 400


@pytest.mark.parametrize("model", ["solo-b", "llama"])
def test_usage_chunk_only_when_asked(fleet: Fleet, model: str) -> None:
    body = {"model": model, "prompt": "Once upon a time", "max_tokens": 5, "temperature": 0, "logit_bias": NO_EOS}
    without = stream_payloads(fleet, "/v1/completions", body)
    assert without[-1] == "[DONE]"
    assert all("usage" not in json.loads(p) for p in without[:-1])
    with_usage = stream_payloads(fleet, "/v1/completions", body | {"stream_options": {"include_usage": True}})
    assert with_usage[-1] == "[DONE]"
    chunks = [json.loads(p) for p in with_usage[:-1]]
    usage_chunks = [c for c in chunks if c["usage"] is not None]
    assert usage_chunks == [chunks[-1]] and chunks[-1]["choices"] == []
    usage = chunks[-1]["usage"]
    if model == "solo-b":  # the node's own count
        assert usage["completion_tokens"] == 5
    else:  # llama-cpp-python's server reports no usage in streams: counted by the gateway, approximately
        assert usage["completion_tokens"] > 0
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"] and usage["prompt_tokens"] > 0
    assert "".join(c["choices"][0]["text"] for c in chunks if c["choices"])


def test_usage_is_estimated_only_when_the_node_reports_none(fleet: Fleet) -> None:
    body = {"prompt": "Once upon a time", "max_tokens": 4, "logit_bias": NO_EOS, "stream": True}
    for model, request_id, estimated in [("solo-b", USAGE_B, None), ("llama", USAGE_LLAMA, "true")]:
        with fleet.http() as http:
            headers = {"X-Request-ID": request_id}
            with http.stream("POST", "/v1/completions", json=body | {"model": model}, headers=headers) as r:
                assert r.status_code == 200
                assert data_lines(r)[-1] == "[DONE]"
        line = request_line(fleet.gateway, request_id)
        assert line.get("usage_estimated") == estimated  # llama-cpp-python's server ignores include_usage
        assert line["node"] == ("b" if model == "solo-b" else "llama")
        assert int(line["completion_tokens"]) > 0


def test_a_nodes_400_reaches_the_client_with_its_message(fleet: Fleet) -> None:
    client = fleet.gateway.client()
    with pytest.raises(openai.BadRequestError) as caught:  # the node (embedded Gemma) has no FIM tokens
        client.completions.create(model="solo-b", prompt="def f(", suffix="return 1", max_tokens=2)
    assert caught.value.status_code == 400
    assert "fill-in-the-middle" in caught.value.body["message"]
    assert caught.value.body["param"] == "suffix"
    with pytest.raises(openai.BadRequestError) as caught:  # a third-party node's own wording
        client.completions.create(model="llama", prompt="word " * 1500, max_tokens=3)
    assert "maximum context length is 1024 tokens" in caught.value.body["message"]
    assert caught.value.body["code"] == "context_length_exceeded"


@pytest.mark.parametrize("status", [500, 429])
def test_a_failing_node_is_skipped_and_its_breaker_opens_and_recovers(fleet: Fleet, status: int) -> None:
    fleet.fault.status, start = status, fleet.fault.generations
    replies = [
        fleet.gateway.client().chat.completions.create(
            model="flaky", messages=[{"role": "user", "content": "hi"}], max_tokens=2
        )
        for _ in range(5)
    ]
    assert all(r.model == "flaky" and r.choices for r in replies)
    assert fleet.fault.generations - start == 2  # two failures opened the breaker; then it was left alone
    assert fleet.nodes("flaky")["fault"]["breaker"] == "open"
    fleet.fault.status = 200
    time.sleep(3.1)  # the cooldown: long enough for the five requests above on a slow machine
    assert fleet.nodes("flaky")["fault"]["breaker"] == "half_open"
    contents = [
        fleet.gateway.client()
        .chat.completions.create(model="flaky", messages=[{"role": "user", "content": "hi"}], max_tokens=2)
        .choices[0]
        .message.content
        for _ in range(2)
    ]
    assert "from fault node" in contents  # the half-open trial went to the recovered node
    assert fleet.nodes("flaky")["fault"]["breaker"] == "closed"


def test_completions_through_a_nodes_chat_endpoint(fleet: Fleet) -> None:
    with fleet.http() as http:
        body = {"model": "via-chat", "prompt": "Say hi", "max_tokens": 3, "logit_bias": NO_EOS}
        response = http.post("/v1/completions", json=body, headers={"X-Request-ID": VIA_CHAT_1})
    assert response.status_code == 200
    reply = response.json()
    assert reply["object"] == "text_completion" and reply["model"] == "via-chat"
    assert reply["choices"][0]["text"] and reply["usage"]["completion_tokens"] == 3
    assert request_line(fleet.b, VIA_CHAT_1)["endpoint"] == "chat.completions"


def test_a_model_mixes_its_embedded_engine_with_nodes(fleet: Fleet) -> None:
    ids = [uuid.uuid4().hex for _ in range(4)]
    for request_id in ids:
        assert short(fleet, "mixed", request_id).status_code == 200
    lines = [request_line(fleet.gateway, request_id) for request_id in ids]
    assert {(line["node"], line["backend"]) for line in lines} == {("embedded", "llama.cpp"), ("b", "upstream")}
    assert all(line.get("usage_estimated") is None for line in lines)
    status = httpx.get(f"{fleet.gateway.base_url}/health", timeout=10).json()["models"]["mixed"]
    assert status["embedded"]["requests"] == 2 and status["embedded"]["engine"]["ready"] is True


def test_nodes_register_and_leave_at_run_time(fleet: Fleet) -> None:
    registration = {"model_id": "dyn", **upstream(fleet.b, "b-dyn"), "api_key": "sk-node-secret"}
    with fleet.http() as http:
        assert http.post("/admin/nodes", json=registration).status_code == 401
        wrong = http.post("/admin/nodes", json=registration, headers={"Authorization": "Bearer nope"})
        assert wrong.status_code == 403
        admin = {"Authorization": f"Bearer {ADMIN}"}
        bad = http.post("/admin/nodes", json={"model_id": "dyn", "url": "not a url"}, headers=admin)
        assert bad.status_code == 400 and bad.json()["error"]["param"] == "url"
        created = http.post("/admin/nodes", json=registration, headers=admin)
        assert created.status_code == 201 and created.json()["name"] == "b-dyn"
        assert http.post("/admin/nodes", json=registration, headers=admin).status_code == 200  # re-registration
        assert "dyn" in [m["id"] for m in http.get("/v1/models").json()["data"]]
        assert short(fleet, "dyn").status_code == 200
        listing = http.get("/admin/nodes", headers=admin)
        assert "sk-node-secret" not in listing.text
        assert {"model_id": "dyn", "name": "b-dyn"}.items() <= listing.json()["data"][-1].items()
        joined = http.post("/admin/nodes", json=registration | {"model_id": "solo-a"}, headers=admin)
        assert joined.status_code == 201 and set(fleet.nodes("solo-a")) == {"a", "b-dyn"}
        assert http.delete("/admin/nodes/b-dyn", params={"model_id": "solo-a"}, headers=admin).status_code == 204
        assert set(fleet.nodes("solo-a")) == {"a"}
        assert http.delete("/admin/nodes/b-dyn", headers=admin).status_code == 204
        assert http.delete("/admin/nodes/b-dyn", headers=admin).status_code == 404
        assert short(fleet, "dyn").status_code == 404
        assert "dyn" not in [m["id"] for m in http.get("/v1/models").json()["data"]]


def test_killed_nodes_mid_stream_and_before_a_request(fleet: Fleet) -> None:
    body = {"model": "solo-a", "prompt": "Count:", "max_tokens": 400, "logit_bias": NO_EOS, "stream": True}
    payloads: list[str] = []
    headers = {"X-Request-ID": KILLED_1}
    with fleet.http() as http, http.stream("POST", "/v1/completions", json=body, headers=headers) as response:
        lines = (line[6:] for line in response.iter_lines() if line.startswith("data: "))
        payloads += [next(lines), next(lines)]
        threading.Thread(target=fleet.a.stop, args=(signal.SIGKILL,)).start()
        payloads += list(lines)
    assert payloads[-1] == "[DONE]"
    error = json.loads(payloads[-2])["error"]
    assert error["code"] == "upstream_error" and "failed while streaming" in error["message"]
    assert "127.0.0.1" not in error["message"]
    sent = sum(1 for p in payloads[:-2] if json.loads(p).get("choices"))
    assert sent >= 2
    line = request_line(fleet.gateway, KILLED_1)
    assert (line["status"], line["node"], line["usage_estimated"]) == ("502", "a", "true")
    assert int(line["completion_tokens"]) >= 1 and int(line["prompt_tokens"]) > 0

    # `pair` has no probes: the dead node is found by trying it, and the client never notices.
    assert [short(fleet, "pair").status_code for _ in range(4)] == [200] * 4
    dead = fleet.nodes("pair")["a"]
    assert dead["errors"] >= 1 and dead["last_error"] == "connection failed"
    # `trio` probes its nodes: the dead one is marked down without a request.
    deadline = time.monotonic() + 5
    while fleet.nodes("trio")["a"]["healthy"] and time.monotonic() < deadline:
        time.sleep(0.1)
    assert fleet.nodes("trio")["a"]["healthy"] is False
