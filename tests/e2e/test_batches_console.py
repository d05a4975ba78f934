"""The console's batches page in headless Chromium, against a real server: a key's batches followed live to their
end, the cancel button, the result files, and which batches another key and the admin key see."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from batch_support import Deployment, chat_line, deploy, submit, wait_ended
from playwright.sync_api import Browser, Page

ADMIN_KEY = "operator-secret-for-batch-console-tests"
PAGE_TIMEOUT_MS = 60_000
POLL_MS = 2000  # batches.js's


@pytest.fixture(scope="module")
def deployment(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    # One line at a time, oldest batch first: a batch submitted behind a long one waits for it.
    env = {"TOKENRELAY_BATCHES__CONCURRENCY": "1", "TOKENRELAY_ADMIN_KEY": ADMIN_KEY}
    deployment = deploy(tmp_path_factory.mktemp("batches-console"), env)
    yield deployment
    deployment.server.stop()


def opened(browser: Browser, deployment: Deployment, key: str) -> Page:
    page = browser.new_context().new_page()
    page.set_default_timeout(PAGE_TIMEOUT_MS)
    page.goto(f"{deployment.server.base_url}/console/batches")
    page.wait_for_selector("#key-dialog[open]")  # the server has keys: the anonymous list was refused
    page.fill("#key-input", key)
    page.click("#key-ok")
    page.wait_for_selector("#dashboard[data-state=ready]")
    return page


def row(batch_id: str) -> str:
    return f"#batches tr[data-batch={batch_id}]"


def progress(page: Page, batch_id: str) -> list[int]:
    """The row's progress bar as [value, max]."""
    return page.eval_on_selector(f"{row(batch_id)} progress", "bar => [bar.value, bar.max]")


def test_the_page_follows_batches_live_and_its_cancel_button_stops_one(
    browser: Browser, deployment: Deployment, tmp_path: Path
) -> None:
    client = deployment.client("alice")
    # Far more lines than run before the cancel below, on any machine; short ones, so that the line running
    # when it is cancelled soon ends.
    long_id = submit(client, [chat_line(f"long{i}", f"Count to {i}.", max_tokens=8) for i in range(200)])
    page = opened(browser, deployment, deployment.keys["alice"])
    page.evaluate("window.notReloaded = true")  # gone if the page were loaded again
    page.wait_for_selector(f"{row(long_id)}[data-status=in_progress] button.cancel")

    # Submitted while the page is open, it shows up by itself (the page polls while the long batch runs), newest
    # first, and it waits behind the long batch: the page surely sees it unfinished.
    lines = [chat_line(f"c{i}", f"Name a fruit, {i}.", max_tokens=4) for i in range(3)]
    short_id = submit(client, lines)
    page.wait_for_selector(f"{row(short_id)}[data-status=in_progress]")
    assert progress(page, short_id) == [0, len(lines)]
    listed = page.eval_on_selector_all("#batches tbody tr", "rows => rows.map((r) => r.dataset.batch)")
    assert listed.index(short_id) < listed.index(long_id)

    page.click(f"{row(long_id)} button.cancel")
    page.wait_for_selector(f"{row(long_id)}:is([data-status=cancelling], [data-status=cancelled])")
    assert client.batches.retrieve(long_id).status in ("cancelling", "cancelled")
    page.wait_for_selector(f"{row(long_id)}[data-status=cancelled]")
    cancelled = wait_ended(client, long_id)
    assert cancelled.status == "cancelled"
    assert cancelled.request_counts is not None and cancelled.request_counts.completed < 200

    # The short batch then runs; its row follows it to the end, the page never reloaded.
    page.wait_for_selector(f"{row(short_id)}[data-status=completed]")
    assert progress(page, short_id) == [len(lines), len(lines)]
    assert page.inner_text(f"{row(short_id)} td.completed") == str(len(lines))
    assert page.inner_text(f"{row(short_id)} td.endpoint") == "/v1/chat/completions"
    assert page.query_selector(f"{row(short_id)} button.cancel") is None
    assert page.evaluate("window.notReloaded") is True

    # Everything ended: the polling stops.
    polls: list[str] = []
    page.on("request", lambda request: polls.append(request.url) if "/v1/batches" in request.url else None)
    page.wait_for_timeout(POLL_MS * 1.5)
    assert polls == []

    # The output file, fetched with the key and saved from the page.
    output = wait_ended(client, short_id).output_file_id
    assert page.get_attribute(f"{row(short_id)} td.files button", "data-file") == output
    with page.expect_download() as download:
        page.click(f"{row(short_id)} td.files button")
    assert download.value.suggested_filename == f"{short_id}_output.jsonl"
    saved = tmp_path / "output.jsonl"
    download.value.save_as(saved)
    assert saved.read_bytes() == client.files.content(output).content
    assert len(saved.read_text().splitlines()) == len(lines)


def test_another_key_sees_none_of_a_keys_batches_and_the_admin_key_sees_them_all(
    browser: Browser, deployment: Deployment
) -> None:
    batch_id = submit(deployment.client("alice"), [chat_line("one", "Say hi.", max_tokens=4)])

    bob = opened(browser, deployment, deployment.keys["bob"])
    assert bob.query_selector(row(batch_id)) is None
    assert bob.is_visible("#empty")

    admin = opened(browser, deployment, ADMIN_KEY)
    admin.wait_for_selector(row(batch_id))
    assert not admin.is_visible("#empty")

    # No key given: the refusal is said on the page.
    nobody = browser.new_context().new_page()
    nobody.goto(f"{deployment.server.base_url}/console/batches")
    nobody.click("#key-dialog[open] button[value=cancel]")
    nobody.wait_for_selector("#notice:not([hidden])")
    assert nobody.query_selector(row(batch_id)) is None
    assert not nobody.is_visible("#empty")
