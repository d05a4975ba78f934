"""The Batch API against a real server, driven with the official `openai` SDK: files, batches, their results,
validation, ownership, cancel, expiry, and a batch that survives its server being killed."""

from __future__ import annotations

import io
import re
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest
from accounting_support import postgres_database, query
from batch_support import (
    CHAT_MODEL,
    FAST,
    Deployment,
    chat_line,
    deploy,
    file_lines,
    jsonl,
    submit,
    wait_answered,
    wait_ended,
)
from observing import eventually, sample, scrape
from servers import SHARED_CORES, start_server


@pytest.fixture(scope="module")
def deployment(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    deployment = deploy(tmp_path_factory.mktemp("batches"), {})
    yield deployment
    deployment.server.stop()


def test_a_batch_answers_every_line_as_the_endpoint_would(deployment: Deployment) -> None:
    client = deployment.client()
    lines = [chat_line(f"q{i}", f"Name a colour, {i}.", temperature=0) for i in range(4)]
    lines.append(chat_line("too-long", "hi", max_tokens=100_000))  # valid, but the engine refuses it: a 400
    batch = wait_ended(client, submit(client, lines))

    assert batch.status == "completed"
    assert batch.request_counts is not None
    assert (batch.request_counts.total, batch.request_counts.completed, batch.request_counts.failed) == (5, 4, 1)
    answered = {row["custom_id"]: row for row in file_lines(client, batch.output_file_id)}
    assert sorted(answered) == ["q0", "q1", "q2", "q3"]
    for line in lines[:4]:
        alone = client.chat.completions.create(**line["body"])
        body = answered[line["custom_id"]]["response"]["body"]
        assert answered[line["custom_id"]]["response"]["status_code"] == 200
        assert body["choices"][0]["message"]["content"] == alone.choices[0].message.content  # greedy: the same
    [failed] = file_lines(client, batch.error_file_id)
    assert failed["custom_id"] == "too-long"
    assert failed["response"]["status_code"] == 400
    assert failed["response"]["body"]["error"]["code"] == "context_length_exceeded"
    assert batch.usage is not None
    output_tokens = sum(row["response"]["body"]["usage"]["completion_tokens"] for row in answered.values())
    assert batch.usage.output_tokens == output_tokens > 0
    # One ledger row per line, naming the batch, under the batch's key.
    rows = query(deployment.url, "SELECT request_id, key_name, status FROM usage WHERE batch_id = :b", b=batch.id)
    assert sorted(r["request_id"] for r in rows) == sorted(f"{batch.id}-{n}" for n in range(1, 6))
    assert {r["key_name"] for r in rows} == {"alice"}
    metrics = deployment.server.http().get("/metrics").text
    assert re.search(r'^tokenrelay_batches\{state="completed"\} [1-9]', metrics, re.M)
    assert re.search(r"^tokenrelay_batch_lines_total ([0-9.]+)", metrics, re.M)


def test_files_round_trip_and_belong_to_their_key(deployment: Deployment) -> None:
    alice, bob = deployment.client("alice"), deployment.client("bob")
    data = b'{"custom_id": "x", "method": "POST", "url": "/v1/embeddings", "body": {}}\n'
    uploaded = alice.files.create(file=("mine.jsonl", io.BytesIO(data)), purpose="batch")
    assert (uploaded.bytes, uploaded.filename, uploaded.purpose) == (len(data), "mine.jsonl", "batch")
    assert alice.files.content(uploaded.id).content == data
    assert uploaded.id in [f.id for f in alice.files.list(purpose="batch")]
    assert uploaded.id not in [f.id for f in bob.files.list()]
    with pytest.raises(openai.NotFoundError):
        bob.files.retrieve(uploaded.id)
    with pytest.raises(openai.NotFoundError):
        bob.batches.create(input_file_id=uploaded.id, endpoint="/v1/embeddings", completion_window="24h")
    batch_id = submit(alice, [chat_line("a", "hi")])
    with pytest.raises(openai.NotFoundError):
        bob.batches.retrieve(batch_id)
    assert batch_id not in [b.id for b in bob.batches.list()]
    assert alice.files.delete(uploaded.id).deleted
    with pytest.raises(openai.NotFoundError):
        alice.files.content(uploaded.id)


def test_bad_uploads_are_refused(deployment: Deployment) -> None:
    client = deployment.client()
    with pytest.raises(openai.BadRequestError) as refused:
        client.files.create(file=("x.jsonl", io.BytesIO(b"{}")), purpose="fine-tune")
    assert refused.value.body["param"] == "purpose"  # type: ignore[index]
    with pytest.raises(openai.NotFoundError):
        client.batches.create(input_file_id="file-missing", endpoint="/v1/chat/completions", completion_window="24h")


def test_an_upload_with_fields_this_server_does_not_use_is_kept_and_names_them(deployment: Deployment) -> None:
    headers = {"Authorization": f"Bearer {deployment.keys['alice']}"}
    form = {"purpose": "batch", "expires_after[anchor]": "created_at", "expires_after[seconds]": "3600"}
    files = {"file": ("extra.jsonl", b'{"custom_id": "x"}\n')}
    answer = deployment.server.http().post("/v1/files", headers=headers, data=form, files=files)
    assert answer.status_code == 200 and answer.json()["filename"] == "extra.jsonl"
    named = answer.headers["x-tokenrelay-ignored-fields"].split(", ")
    assert named == ["expires_after[anchor]", "expires_after[seconds]"]
    plain = deployment.server.http().post("/v1/files", headers=headers, data={"purpose": "batch"}, files=files)
    assert plain.status_code == 200 and "x-tokenrelay-ignored-fields" not in plain.headers


def test_a_bad_input_file_fails_the_batch_naming_each_line(deployment: Deployment) -> None:
    client = deployment.client()
    good = chat_line("ok", "hi")
    lines = [
        good,
        chat_line("ok", "again"),  # the same custom_id
        {**chat_line("elsewhere", "hi"), "url": "/v1/completions"},
        chat_line("nobody", "hi", model="no-such-model"),
        chat_line("bad-field", "hi", temperature="hot"),
    ]
    uploaded = client.files.create(
        file=("in.jsonl", io.BytesIO(jsonl(lines).getvalue() + b"\nnot json")), purpose="batch"
    )
    batch = client.batches.create(input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h")
    batch = wait_ended(client, batch.id)
    assert batch.status == "failed"
    assert batch.errors is not None and batch.errors.data is not None
    codes = {e.line: e.code for e in batch.errors.data}
    assert sorted(codes) == [2, 3, 4, 5, 6]
    assert [codes[2], codes[3], codes[4], codes[6]] == [
        "duplicate_custom_id",
        "mismatched_url",
        "model_not_found",
        "invalid_json_line",
    ]
    assert next(e for e in batch.errors.data if e.line == 5).param == "body.temperature"
    assert batch.output_file_id is None and batch.request_counts is not None and batch.request_counts.total == 0


def test_cancel_keeps_what_is_done_and_names_what_did_not_run(deployment: Deployment) -> None:
    client = deployment.client()
    lines = [chat_line(f"c{i}", f"Count to {i}.", max_tokens=24) for i in range(40)]
    batch_id = submit(client, lines)
    while client.batches.retrieve(batch_id).status == "validating":
        time.sleep(0.1)
    cancelling = client.batches.cancel(batch_id)
    assert cancelling.status in ("cancelling", "cancelled")
    batch = wait_ended(client, batch_id)
    assert batch.status == "cancelled"
    done = file_lines(client, batch.output_file_id)
    unrun = file_lines(client, batch.error_file_id)
    assert sorted(r["custom_id"] for r in done + unrun) == sorted(line["custom_id"] for line in lines)
    assert unrun and all(r["error"]["code"] == "batch_cancelled" for r in unrun)
    assert client.batches.cancel(batch_id).status == "cancelled"  # asking again changes nothing
    finished = wait_ended(client, submit(client, [chat_line("one", "hi")]))
    with pytest.raises(openai.APIStatusError) as refused:
        client.batches.cancel(finished.id)
    assert refused.value.status_code == 409


def test_an_expired_batch_puts_its_unrun_lines_in_the_error_file(tmp_path: Path) -> None:
    deployment = deploy(tmp_path, {"TOKENRELAY_BATCHES__WINDOW_SECONDS": "2", "TOKENRELAY_BATCHES__CONCURRENCY": "1"})
    try:
        client = deployment.client()
        lines = [chat_line(f"e{i}", f"Write about {i}.", max_tokens=32) for i in range(60)]
        batch = wait_ended(client, submit(client, lines))
        assert batch.status == "expired" and batch.expired_at is not None
        done = file_lines(client, batch.output_file_id)
        unrun = file_lines(client, batch.error_file_id)
        assert sorted(r["custom_id"] for r in done + unrun) == sorted(line["custom_id"] for line in lines)
        assert unrun and all(r["error"]["code"] == "batch_expired" for r in unrun)
    finally:
        deployment.server.stop()


def test_a_killed_server_resumes_its_batch_without_answering_or_charging_a_line_twice(tmp_path: Path) -> None:
    deployment = deploy(tmp_path, {"TOKENRELAY_BATCHES__CONCURRENCY": "2"})
    lines = [chat_line(f"k{i}", f"Tell me about {i}.", max_tokens=16) for i in range(16)]
    client = deployment.client()
    batch_id = submit(client, lines)
    wait_answered(client, batch_id, 3)
    deployment.server.stop(signal.SIGKILL)

    again = start_server(tmp_path, "--database-url", deployment.url, env=FAST)
    try:
        client = again.client(api_key=deployment.keys["alice"])
        batch = wait_ended(client, batch_id)
        assert batch.status == "completed"
        answered = [row["custom_id"] for row in file_lines(client, batch.output_file_id)]
        assert sorted(answered) == sorted(line["custom_id"] for line in lines)  # each once
        rows = query(deployment.url, "SELECT request_id FROM usage WHERE batch_id = :b", b=batch_id)
        charged = [row["request_id"] for row in rows]
        assert len(charged) == len(set(charged))  # no line charged twice
    finally:
        again.stop()


def test_two_replicas_on_postgresql_share_a_batch_and_answer_each_line_once(tmp_path: Path) -> None:
    with postgres_database() as url:
        env = {"TOKENRELAY_BATCHES__CONCURRENCY": "2"} | SHARED_CORES
        first = deploy(tmp_path, env, url)
        second = start_server(tmp_path, "--database-url", url, env=FAST | env)
        try:
            client = first.client()
            lines = [chat_line(f"p{i}", f"Say {i}.", max_tokens=12) for i in range(16)]
            batch = wait_ended(client, submit(client, lines))
            assert batch.status == "completed"
            answered = [row["custom_id"] for row in file_lines(client, batch.output_file_id)]
            assert sorted(answered) == sorted(line["custom_id"] for line in lines)
            rows = query(url, "SELECT request_id FROM usage WHERE batch_id = :b", b=batch.id)
            assert len(rows) == len({row["request_id"] for row in rows}) == len(lines)
            for replica in (first.server, second):  # both took lines (the request log names each line's id)
                assert f"{batch.id}-" in replica.log()
        finally:
            second.stop()
            first.server.stop()


ENDPOINT_LINES = {
    "/v1/completions": {"model": "gemma-3-270m", "prompt": "The sky is", "max_tokens": 5, "temperature": 0},
    "/v1/embeddings": {"model": CHAT_MODEL, "input": ["one", "two"]},
    "/v1/responses": {"model": CHAT_MODEL, "input": "Name a fruit.", "max_output_tokens": 6, "temperature": 0},
}


@pytest.mark.parametrize("endpoint", list(ENDPOINT_LINES))
def test_every_batch_endpoint_answers_as_a_direct_request(deployment: Deployment, endpoint: str) -> None:
    client = deployment.client()
    body = ENDPOINT_LINES[endpoint]
    batch = wait_ended(
        client, submit(client, [{"custom_id": "x", "method": "POST", "url": endpoint, "body": body}], endpoint)
    )
    assert batch.status == "completed"
    [row] = file_lines(client, batch.output_file_id)
    answered = row["response"]["body"]
    with deployment.server.http(headers={"Authorization": f"Bearer {deployment.keys['alice']}"}) as http:
        direct = http.post(endpoint, json=body).json()
    if endpoint == "/v1/completions":
        assert answered["choices"][0]["text"] == direct["choices"][0]["text"]
    elif endpoint == "/v1/embeddings":
        assert [d["embedding"] for d in answered["data"]] == [d["embedding"] for d in direct["data"]]
    else:
        assert answered["output"][0]["content"][0]["text"] == direct["output"][0]["content"][0]["text"]
    assert batch.usage is not None and batch.usage.input_tokens == direct["usage"].get(
        "prompt_tokens", direct["usage"].get("input_tokens")
    )


def test_a_file_over_the_limit_is_413(tmp_path: Path) -> None:
    deployment = deploy(tmp_path, {"TOKENRELAY_BATCHES__MAX_FILE_BYTES": "1000"})
    try:
        with pytest.raises(openai.APIStatusError) as refused:
            deployment.client().files.create(file=("big.jsonl", io.BytesIO(b"x" * 70_000)), purpose="batch")
        assert refused.value.status_code == 413
        small = deployment.client().files.create(file=("ok.jsonl", io.BytesIO(b"y" * 1000)), purpose="batch")
        assert small.bytes == 1000
        with pytest.raises(openai.APIStatusError) as refused:
            deployment.client().files.create(file=("edge.jsonl", io.BytesIO(b"z" * 1001)), purpose="batch")
        assert refused.value.status_code == 413
    finally:
        deployment.server.stop()


def test_a_stopped_server_parks_its_running_lines_and_each_line_is_charged_for_its_answer(tmp_path: Path) -> None:
    # Too short a drain for a 48-token line: lines running at SIGTERM are cut and put back, then run again.
    deployment = deploy(tmp_path, {"TOKENRELAY_BATCHES__CONCURRENCY": "2", "TOKENRELAY_SHUTDOWN_TIMEOUT": "0.2"})
    lines = [chat_line(f"s{i}", f"Count from one to fifty, {i}.", max_tokens=48, temperature=0) for i in range(8)]
    client = deployment.client()
    batch_id = submit(client, lines)
    wait_answered(client, batch_id, 2)
    time.sleep(0.5)  # the next lines are part-way through
    deployment.server.stop()  # SIGTERM
    states = query(deployment.url, "SELECT state, claim FROM batch_lines WHERE batch_id = :b", b=batch_id)
    assert {row["state"] for row in states} <= {"pending", "done"}  # nothing left claimed by the stopped server
    assert all(row["claim"] is None for row in states if row["state"] == "pending")
    assert "running line(s)" in deployment.server.log()

    again = start_server(tmp_path, "--database-url", deployment.url, env=FAST)
    try:
        client = again.client(api_key=deployment.keys["alice"])
        batch = wait_ended(client, batch_id)
        assert batch.status == "completed"
        answers = {row["response"]["request_id"]: row for row in file_lines(client, batch.output_file_id)}
        assert sorted(row["custom_id"] for row in answers.values()) == sorted(line["custom_id"] for line in lines)
        sql = "SELECT request_id, prompt_tokens, completion_tokens FROM usage WHERE batch_id = :b"
        rows = query(deployment.url, sql, b=batch_id)
        assert len(rows) == len(lines)  # one row per line: a cut run's row is replaced by the answered run's
        for row in rows:  # and each charges the answer in the output file
            usage = answers[row["request_id"]]["response"]["body"]["usage"]
            assert row["prompt_tokens"] == usage["prompt_tokens"]
            assert row["completion_tokens"] == usage["completion_tokens"]
    finally:
        again.stop()


def test_an_interactive_request_takes_a_slot_from_batch_work_and_the_line_runs_again(tmp_path: Path) -> None:
    env = {
        "TOKENRELAY_ENGINE__SLOTS": "2",
        "TOKENRELAY_ENGINE__INTERACTIVE_SLOTS": "0",
        "TOKENRELAY_BATCHES__CONCURRENCY": "2",
    }
    deployment = deploy(tmp_path, env)
    try:
        client = deployment.client()
        lines = [chat_line(f"b{i}", f"Write about rivers, {i}.", max_tokens=64, temperature=0) for i in range(4)]
        batch_id = submit(client, lines)

        def both_slots_hold_lines() -> bool:
            return sample(scrape(deployment.server), "tokenrelay_engine_busy_slots", model=CHAT_MODEL) == 2

        eventually(both_slots_hold_lines, timeout=120)
        answer = client.chat.completions.create(
            model=CHAT_MODEL, messages=[{"role": "user", "content": "Hi"}], max_tokens=4
        )
        assert answer.choices[0].message.content
        batch = wait_ended(client, batch_id)
        assert batch.status == "completed"
        assert re.search(rf"request_id={batch_id}-\d+ .*status=503", deployment.server.log())  # a line gave way
        answers = {row["response"]["request_id"]: row for row in file_lines(client, batch.output_file_id)}
        assert sorted(row["custom_id"] for row in answers.values()) == sorted(line["custom_id"] for line in lines)
        rows = query(deployment.url, "SELECT request_id, completion_tokens FROM usage WHERE batch_id = :b", b=batch_id)
        charged = {row["request_id"]: row["completion_tokens"] for row in rows}
        assert len(rows) == len(lines)
        assert charged == {rid: row["response"]["body"]["usage"]["completion_tokens"] for rid, row in answers.items()}
    finally:
        deployment.server.stop()
