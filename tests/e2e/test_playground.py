"""The playground at `/` in headless Chromium (Debian's package) driven by Playwright, against a real server."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from helpers import CHAT_MODEL
from observing import eventually, text_request_lines
from playwright.sync_api import Browser, Page, Request, Route
from servers import DEFAULT_MODEL, Server

from tokenrelay.errors import AuthenticationError

REPLY_TIMEOUT_MS = 120_000
USAGE = re.compile(r"prompt (\d+) · completion (\d+) · total (\d+)")
# Records every state the reply's text goes through, to tell a streamed reply from one that appears at once.
RECORD_SNAPSHOTS = """() => {
  window.snapshots = [];
  new MutationObserver(() => {
    const replies = document.querySelectorAll('.msg.assistant .content');
    if (replies.length) window.snapshots.push(replies[replies.length - 1].textContent);
  }).observe(document.getElementById('transcript'), {childList: true, subtree: true, characterData: true});
}"""


@dataclass
class Playground:
    """One browser tab on the playground, remembering what the page sent and any script error."""

    page: Page
    server: Server
    requests: list[Request] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    def open(self, model: str = CHAT_MODEL) -> None:
        self.page.goto(f"{self.server.base_url}/")
        self.wait_for_model(model)

    def wait_for_model(self, model: str) -> None:
        self.page.wait_for_function(f"document.getElementById('model').value === {json.dumps(model)}")

    def set_range(self, selector: str, value: str) -> None:
        script = "(el, v) => { el.value = v; el.dispatchEvent(new Event('input')); }"
        self.page.eval_on_selector(selector, script, value)

    def send(self, text: str) -> tuple[dict[str, Any], str]:
        """Sends a message; returns the request body and the request id the server answered with."""
        self.page.fill("#prompt", text)
        with self.page.expect_response("**/v1/chat/completions") as answer:
            self.page.click("#send")
        response = answer.value
        self.page.wait_for_selector(".msg.assistant[data-state=done]", timeout=REPLY_TIMEOUT_MS)
        return response.request.post_data_json, response.headers["x-request-id"]

    def reply_text(self) -> str:
        return self.page.inner_text(".msg.assistant .content")


@pytest.fixture
def playground(browser: Browser, server: Server) -> Iterator[Playground]:
    context = browser.new_context(viewport={"width": 1200, "height": 760})
    tab = Playground(context.new_page(), server)
    tab.page.on("request", lambda request: tab.requests.append(request))
    tab.page.on("pageerror", lambda error: tab.errors.append(str(error)))
    yield tab
    context.close()


def test_assets_ship_in_the_package_without_a_cdn(server: Server) -> None:
    with server.http() as http:
        page = http.get("/")
        assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
        assets = re.findall(r'(?:src|href)="(/console/static/[^"]+)"', page.text)
        assert sorted(assets) == ["/console/static/console.css", "/console/static/playground.js"]
        for path in assets:
            asset = http.get(path)
            assert asset.status_code == 200
            assert "http://" not in asset.text and "https://" not in asset.text
        assert http.get("/console/static/missing.js").status_code == 404


def test_chat_streams_text_and_shows_usage(playground: Playground, server: Server, tmp_path: Path) -> None:
    playground.open()
    playground.set_range("#temperature", "0")
    playground.page.fill("#max-tokens", "8")
    playground.page.fill("#seed", "7")
    playground.page.fill("#stop", "zzz")
    playground.page.evaluate(RECORD_SNAPSHOTS)
    body, request_id = playground.send("Name three colours.")

    assert body["model"] == CHAT_MODEL  # the page opens on the chat model, not on the base model listed first
    assert body["messages"] == [{"role": "user", "content": "Name three colours."}]
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}
    assert (body["temperature"], body["max_tokens"], body["seed"], body["stop"]) == (0, 8, 7, ["zzz"])
    assert "logprobs" not in body

    text = playground.reply_text()
    snapshots = [s for s in playground.page.evaluate("window.snapshots") if s]
    assert text and snapshots[-1] == text
    assert len(set(snapshots)) >= 2, "the reply appeared at once instead of streaming in"
    assert all(text.startswith(s) for s in snapshots)

    usage = USAGE.search(playground.page.inner_text(".msg.assistant .usage"))
    assert usage is not None
    prompt, completion, total = map(int, usage.groups())
    assert 0 < completion <= 8 and prompt > 0 and total == prompt + completion
    (logged,) = eventually(lambda: text_request_lines(server, request_id))
    assert (int(logged["prompt_tokens"]), int(logged["completion_tokens"])) == (prompt, completion)

    assert all(r.url.startswith(server.base_url) or r.url.startswith("data:") for r in playground.requests)
    assert not playground.errors
    playground.page.screenshot(path=tmp_path / "playground-chat.png")


def rgb(css: str) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", css)[:3])


def test_token_probabilities_shade_each_token(playground: Playground, tmp_path: Path) -> None:
    playground.open()
    playground.set_range("#temperature", "1")
    playground.page.fill("#max-tokens", "8")
    playground.page.fill("#seed", "11")
    playground.page.check("#logprobs")
    playground.page.fill("#top-logprobs", "3")
    body, _ = playground.send("Write a short poem about the sea.")
    assert (body["logprobs"], body["top_logprobs"]) == (True, 3)

    tokens = playground.page.eval_on_selector_all(
        ".msg.assistant .content .token",
        """spans => spans.map(s => ({text: s.textContent, logprob: Number(s.dataset.logprob),
                                     background: getComputedStyle(s).backgroundColor, title: s.title}))""",
    )
    assert tokens, "no shaded tokens"
    assert "".join(t["text"] for t in tokens) == playground.reply_text()
    assert all(t["logprob"] <= 0 and "alternatives" in t["title"] for t in tokens)
    likeliest = max(tokens, key=lambda t: t["logprob"])
    unlikeliest = min(tokens, key=lambda t: t["logprob"])
    if likeliest["logprob"] - unlikeliest["logprob"] > 0.5:
        green_minus_red = [rgb(t["background"])[1] - rgb(t["background"])[0] for t in (likeliest, unlikeliest)]
        assert green_minus_red[0] > green_minus_red[1], "likelier tokens should be shaded greener"
    assert not playground.errors
    playground.page.screenshot(path=tmp_path / "playground-logprobs.png")


def test_stop_cuts_the_reply_short_and_the_server_sees_it(playground: Playground, server: Server) -> None:
    playground.open()
    playground.page.fill("#max-tokens", "400")
    playground.page.fill("#prompt", "Tell me a long story.")
    with playground.page.expect_response("**/v1/chat/completions") as answer:
        playground.page.click("#send")
    request_id = answer.value.headers["x-request-id"]
    playground.page.wait_for_function("document.querySelector('.msg.assistant .content').textContent.length > 0")
    playground.page.click("#stop-button")
    playground.page.wait_for_selector(".msg.assistant[data-state=stopped]")
    (logged,) = eventually(lambda: text_request_lines(server, request_id))
    assert logged["status"] == "499"
    assert playground.page.is_enabled("#send")
    assert not playground.errors


def test_asks_for_a_key_on_401_and_keeps_it_for_the_tab_only(playground: Playground, tmp_path: Path) -> None:
    key = "sk-playground-session-key"
    refused: list[str] = []

    def require_key(route: Route) -> None:
        # The gateway's key store is another issue's work: here the browser meets a server that answers 401
        # until it sends this key, and the authorised requests go on to the real server.
        if route.request.headers.get("authorization") == f"Bearer {key}":
            route.continue_()
            return
        refused.append(route.request.url)
        body = json.dumps(AuthenticationError("Invalid API key.").body())
        route.fulfill(status=401, content_type="application/json", body=body)

    playground.page.route("**/v1/**", require_key)
    playground.page.goto(f"{playground.server.base_url}/")
    playground.page.wait_for_selector("#key-dialog[open]")
    playground.page.screenshot(path=tmp_path / "playground-key.png")
    playground.page.fill("#key-input", key)
    playground.page.click("#key-ok")
    playground.wait_for_model(CHAT_MODEL)
    assert playground.page.evaluate("sessionStorage.getItem('tokenrelay.apiKey')") == key
    assert playground.page.evaluate("localStorage.length") == 0
    assert playground.page.is_visible("#key-state")

    playground.page.fill("#max-tokens", "2")
    playground.send("Hi")
    chat = [r for r in playground.requests if r.url.endswith("/v1/chat/completions")]
    assert [r.headers.get("authorization") for r in chat] == [f"Bearer {key}"]
    assert len(refused) == 1  # only the first /v1/models, before the key was given

    playground.open()  # a reload in the same tab keeps the key and asks for nothing
    assert len(refused) == 1
    assert not playground.page.is_visible("#key-dialog")
    assert not playground.errors


def test_no_key_is_asked_for_when_the_server_needs_none(playground: Playground) -> None:
    playground.open()
    assert not playground.page.is_visible("#key-dialog")
    assert not playground.page.is_visible("#key-state")
    assert httpx.get(f"{playground.server.base_url}/v1/models").status_code == 200


def test_the_model_picked_is_kept_for_the_tab(playground: Playground) -> None:
    playground.open()
    playground.page.select_option("#model", DEFAULT_MODEL)  # the base model, for completions
    playground.open(DEFAULT_MODEL)  # a reload in the same tab keeps the user's pick
    playground.page.context.new_page().goto(f"{playground.server.base_url}/")
    fresh = playground.page.context.pages[-1]
    fresh.wait_for_function(f"document.getElementById('model').value === {json.dumps(CHAT_MODEL)}")  # a new tab
    assert not playground.errors
