"""A page opened while the model is still loading says so and becomes usable on its own once it has loaded.

The server runs in this process (uvicorn in a thread, as `serve` configures it) on the reference backend,
whose factory waits for the test's signal: the load ends exactly when the test says, with no sleep.
"""

from __future__ import annotations

import dataclasses
import socket
import threading
from collections.abc import Iterator

import pytest
import uvicorn
from playwright.sync_api import Browser, expect

from sluicegate.api.app import create_app
from sluicegate.api.server.run import uvicorn_config
from sluicegate.backends.reference import ReferenceRunner
from sluicegate.config import Config
from tests.browser.conftest import Console, open_page


@pytest.fixture
def loading(browser: Browser) -> Iterator[tuple[str, threading.Event]]:
    release = threading.Event()

    def factory() -> ReferenceRunner:
        assert release.wait(timeout=120), "the test never let the model load"
        return ReferenceRunner(n_ctx=512, n_slots=2)

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    config = dataclasses.replace(Config(), host="127.0.0.1", port=port)
    server = uvicorn.Server(uvicorn_config(create_app(config, factory), config, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{port}", release
    finally:
        release.set()
        server.should_exit = True
        thread.join(timeout=30)


def test_a_page_opened_while_the_model_loads_waits_for_it(
    browser: Browser, loading: tuple[str, threading.Event], console: Console
) -> None:
    url, release = loading
    console.allowed_statuses.add(503)  # /v1/models answers 503 not_ready while the model loads
    page = open_page(browser, f"{url}/", console)
    try:
        page.wait_for_selector("body[data-auth='waiting']")
        expect(page.locator("#identity")).to_contain_text("the model is still loading; trying again in")
        release.set()
        page.wait_for_selector("body[data-ready='true']")
        expect(page.locator("#model option")).to_have_count(1)
        expect(page.locator("#identity")).to_contain_text("reference")
    finally:
        page.context.close()
    assert console.unexpected() == [], console.errors
