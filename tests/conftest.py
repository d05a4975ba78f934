"""Shared fixtures: a real `tokenrelay serve` process on loopback, driven with the official `openai` client;
Debian's Chromium for the console's browser tests."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from openai import OpenAI
from servers import Server, start_server

if TYPE_CHECKING:
    from playwright.sync_api import Browser


@pytest.fixture(scope="session")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """The default model served with default settings, shared by the end-to-end tests of one run."""
    srv = start_server(tmp_path_factory.mktemp("server"))
    yield srv
    srv.stop()


@pytest.fixture(scope="session")
def client(server: Server) -> OpenAI:
    return server.client()


CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    """Debian's headless Chromium driven by Playwright (`playwright install` is never used)."""
    chromium = shutil.which("chromium") or "/usr/bin/chromium"
    if not Path(chromium).exists():
        pytest.skip("Debian's chromium is not installed (.ci/run installs it with apt-get)")
    from playwright.sync_api import sync_playwright  # only the browser tests need Playwright

    with sync_playwright() as playwright:
        instance = playwright.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS)
        yield instance
        instance.close()
