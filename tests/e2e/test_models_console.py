"""The console's models page against a real server with two engine models and room for one loaded: the page and
its links, then in headless Chromium both models listed with their residency, Load swapping them, and the API's
refusals (no admin key, an unload while a request is in flight) said on the page."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from gateway_support import wait_for
from playwright.sync_api import Browser, Page
from servers import Server, start_server

from tokenrelay.backends.llamacpp.default_model import smollm2_path
from tokenrelay.console import pages

ADMIN = "models-console-admin-key-0123456789"
SMOL_A, SMOL_B = "smol-a", "smol-b"
PAGE_TIMEOUT_MS = 120_000  # a load takes seconds, and half a minute on a busy machine
POLL_MS = 3000  # models.js's
CONSOLE_PAGES = ["/", "/console/usage", "/console/batches", "/console/models"]
# SmolLM2's end-of-text tokens banned: a stream runs to its max_tokens, so it stays in flight while the test acts.
NO_END = {"0": -100, "1": -100, "2": -100}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    tmp = tmp_path_factory.mktemp("models-console")
    smol = str(smollm2_path(Path()))
    config = {
        "admin_key": ADMIN,
        "engine": {"slots": 2, "ctx_per_slot": 512, "long_slots": 0, "max_loaded_models": 1},
        "models": [{"id": SMOL_A, "path": smol}, {"id": SMOL_B, "path": smol}],
    }
    (tmp / "tokenrelay.yaml").write_text(yaml.safe_dump(config))
    server = start_server(tmp, "--config", str(tmp / "tokenrelay.yaml"))
    try:
        yield server
    finally:
        server.stop()


def states(server: Server) -> dict[str, dict[str, Any]]:
    with server.http(headers={"Authorization": f"Bearer {ADMIN}"}) as http:
        return {model["id"]: model for model in http.get("/admin/models").json()["data"]}


def opened(browser: Browser, server: Server) -> Page:
    page = browser.new_context().new_page()
    page.set_default_timeout(PAGE_TIMEOUT_MS)
    page.goto(f"{server.base_url}/console/models")
    page.wait_for_selector("#key-dialog[open]")  # the anonymous list was refused
    page.fill("#key-input", ADMIN)
    page.click("#key-ok")
    page.wait_for_selector("#dashboard[data-state=ready]")
    return page


def row(model: str) -> str:
    return f"#models tr[data-model={model}]"


def text(page: Page, selector: str) -> str:
    return page.eval_on_selector(selector, "e => e.textContent.trim()")


def mib(size: int) -> str:
    """A size as models.js writes it: MiB with at most one decimal, thousands grouped."""
    return f"{size / 2**20:,.1f}".removesuffix(".0")


def test_the_page_and_its_script_ship_and_every_console_page_links_to_it(server: Server) -> None:
    with server.http() as http:  # the pages hold no data, so they need no key
        page = http.get("/console/models")
        assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
        assert page.headers["cache-control"] == "no-cache"
        assets = set(re.findall(r'(?:src|href)="(/console/static/[^"]+)"', page.text))
        assert assets == {"/console/static/console.css", "/console/static/models.js"}
        script = http.get("/console/static/models.js")
        assert script.status_code == 200 and "http://" not in script.text and "https://" not in script.text
        shipped = {p.name for p in pages.page_path("models.html").parent.iterdir()}
        assert set(re.findall(r'from "\./([^"]+)"', script.text)) <= shipped
        for path in CONSOLE_PAGES:
            nav = re.search(r'<nav class="pages">(.*?)</nav>', http.get(path).text, re.S)
            assert nav and re.findall(r'href="([^"]+)"', nav.group(1)) == CONSOLE_PAGES, path


def test_the_page_lists_both_models_and_its_load_button_swaps_them(browser: Browser, server: Server) -> None:
    before = states(server)
    # One model fits: the first is loaded at start, the other waits for its first request or a Load.
    loaded, unloaded = sorted(before, key=lambda model: before[model]["state"] != "loaded")
    assert [before[loaded]["state"], before[unloaded]["state"]] == ["loaded", "unloaded"]

    page = opened(browser, server)
    page.evaluate("window.notReloaded = true")  # gone if the page were loaded again
    for model in (loaded, unloaded):
        assert page.get_attribute(row(model), "data-state") == before[model]["state"]
        assert text(page, f"{row(model)} td.state") == before[model]["state"]
        assert text(page, f"{row(model)} td.pinned") == "no"
        assert text(page, f"{row(model)} td.context") == "512"
        assert text(page, f"{row(model)} td.in-flight") == "0"
    assert text(page, f"{row(unloaded)} td.memory") == f"0 (est. {mib(before[unloaded]['memory_estimate_bytes'])})"
    assert text(page, f"{row(loaded)} td.memory") == mib(before[loaded]["memory_bytes"])
    assert page.is_disabled(f"{row(loaded)} button.load") and page.is_enabled(f"{row(loaded)} button.unload")
    assert page.is_enabled(f"{row(unloaded)} button.load") and page.is_disabled(f"{row(unloaded)} button.unload")

    page.click(f"{row(unloaded)} button.load")
    page.wait_for_selector(f"{row(unloaded)}[data-state=loaded]")
    page.wait_for_selector(f"{row(loaded)}[data-state=unloaded]")
    after = states(server)
    assert after[unloaded]["state"] == "loaded" and after[loaded]["state"] == "unloaded"
    for model in (loaded, unloaded):
        assert text(page, f"{row(model)} td.loads") == f"{after[model]['loads']} / {after[model]['unloads']}"
    assert not page.is_visible("#notice")
    assert page.evaluate("window.notReloaded") is True


def test_an_unload_the_api_refuses_shows_its_message(browser: Browser, server: Server) -> None:
    model = next(model for model, state in states(server).items() if state["state"] == "loaded")
    client = server.client(api_key=ADMIN)
    messages = [{"role": "user", "content": "Count to a thousand."}]
    stream = client.chat.completions.create(
        model=model, messages=messages, max_tokens=400, stream=True, logit_bias=NO_END
    )
    try:
        next(iter(stream))
        wait_for(lambda: states(server)[model]["in_flight"] == 1, "the stream holds the model")
        page = opened(browser, server)
        assert text(page, f"{row(model)} td.in-flight") == "1"
        page.click(f"{row(model)} button.unload")
        page.wait_for_selector("#notice:not([hidden])")
        notice = text(page, "#notice")
        assert notice.startswith(f"Could not unload {model}: ") and "requests in flight" in notice
        assert page.get_attribute(row(model), "data-state") == "loaded"
    finally:
        stream.close()  # the server stops generating when the client goes
    wait_for(lambda: states(server)[model]["in_flight"] == 0, "the closed stream lets go of the model")

    # The problem stays through polls until the next click: Refresh clears it.
    page.wait_for_timeout(POLL_MS * 1.5)
    assert page.is_visible("#notice")
    page.click("#refresh")
    page.wait_for_selector("#notice[hidden]", state="attached")


def test_without_the_admin_key_the_page_says_why_and_stops_polling(browser: Browser, server: Server) -> None:
    page = browser.new_context().new_page()
    page.set_default_timeout(PAGE_TIMEOUT_MS)
    page.goto(f"{server.base_url}/console/models")
    page.click("#key-dialog[open] button[value=cancel]")
    page.wait_for_selector("#notice:not([hidden])")
    with httpx.Client(base_url=server.base_url) as http:
        refusal = http.get("/admin/models").json()["error"]["message"]
    assert text(page, "#notice") == refusal
    assert page.query_selector("#models tbody tr") is None

    polls: list[str] = []  # asking for the key again every few seconds would be a nuisance
    page.on("request", lambda request: polls.append(request.url) if "/admin/models" in request.url else None)
    page.wait_for_timeout(POLL_MS * 1.5)
    assert polls == []
