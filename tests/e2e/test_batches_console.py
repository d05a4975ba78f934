"""The console's batches page in headless Chromium, against a real server: a key's batches with live progress, not
another key's, their result files, and cancelling one."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from batch_support import Deployment, chat_line, deploy, submit, wait_ended
from playwright.sync_api import Browser, Page

PAGE_TIMEOUT_MS = 60_000


@pytest.fixture(scope="module")
def deployment(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    # One line at a time, so that a batch is still running while the page watches it.
    deployment = deploy(tmp_path_factory.mktemp("batches-console"), {"TOKENRELAY_BATCHES__CONCURRENCY": "1"})
    yield deployment
    deployment.server.stop()


def opened(browser: Browser, deployment: Deployment, key: str) -> Page:
    page = browser.new_context().new_page()
    page.set_default_timeout(PAGE_TIMEOUT_MS)
    page.goto(f"{deployment.server.base_url}/console/batches")
    page.wait_for_selector("#key-dialog[open]")  # the server has keys: the anonymous list was refused
    page.fill("#key-input", deployment.keys[key])
    page.click("#key-ok")
    page.wait_for_selector("#dashboard[data-state=ready]")
    return page


def test_the_page_follows_a_batch_to_its_end_and_shows_only_the_keys_batches(
    browser: Browser, deployment: Deployment
) -> None:
    client = deployment.client()
    lines = [chat_line(f"c{i}", f"Name a fruit, {i}.", max_tokens=4) for i in range(6)]
    page = opened(browser, deployment, "alice")
    batch_id = submit(client, lines)
    page.click("#refresh")
    row = f"#batches tr[data-batch={batch_id}]"
    page.wait_for_selector(row)
    # No reload from here on: the page polls while the batch runs.
    page.wait_for_selector(f"{row}[data-status=completed]")
    assert page.eval_on_selector(f"{row} progress", "bar => [bar.value, bar.max]") == [len(lines), len(lines)]
    assert page.inner_text(f"{row} td.completed") == str(len(lines))
    assert page.inner_text(f"{row} td.endpoint") == "/v1/chat/completions"
    output = wait_ended(client, batch_id).output_file_id
    assert page.get_attribute(f"{row} td.files button", "data-file") == output
    with page.expect_download() as download:
        page.click(f"{row} td.files button")
    assert download.value.suggested_filename == f"{batch_id}_output.jsonl"
    assert len(client.files.content(output).text.splitlines()) == len(lines)

    other = opened(browser, deployment, "bob")
    assert other.query_selector(row) is None
    assert other.is_visible("#empty")


def test_the_cancel_button_cancels_a_running_batch(browser: Browser, deployment: Deployment) -> None:
    client = deployment.client()
    batch_id = submit(client, [chat_line(f"x{i}", f"Tell a story, {i}.", max_tokens=24) for i in range(40)])
    page = opened(browser, deployment, "alice")
    row = f"#batches tr[data-batch={batch_id}]"
    page.wait_for_selector(f"{row}[data-status=in_progress]")
    page.click(f"{row} button.cancel")
    page.wait_for_selector(f"{row}[data-status=cancelled]")
    batch = wait_ended(client, batch_id)
    assert batch.status == "cancelled"
    assert batch.request_counts is not None and batch.request_counts.completed < 40
