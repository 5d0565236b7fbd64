"""Browser fixtures: the system's Chromium (Debian's `chromium`) driven by Playwright for Python, against a real
server with the real model on 127.0.0.1. Playwright's own browser download is not used (nor reachable here).

`SLUICEGATE_SCREENSHOTS=1` makes the tests refresh the panel screenshots in docs/img/ (README, docs/playground.md).
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.e2e.conftest import Server, start_server, stop_server

CHROMIUM = os.environ.get("SLUICEGATE_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
IMG = Path(__file__).resolve().parents[2] / "docs" / "img"

try:
    from playwright.sync_api import Browser, ConsoleMessage, Page, Playwright, sync_playwright
except ImportError:  # pragma: no cover - the dev extras install it
    sync_playwright = None  # type: ignore[assignment]

pytestmark = pytest.mark.browser


@dataclass
class Console:
    """What the page reported: console errors and uncaught exceptions. A test that provokes a refusal on
    purpose lists the statuses it expects Chromium to log ("Failed to load resource: ... status of 400")."""

    errors: list[str] = field(default_factory=list)
    allowed_statuses: set[int] = field(default_factory=set)

    def unexpected(self) -> list[str]:
        out = []
        for e in self.errors:
            m = re.match(r"Failed to load resource: the server responded with a status of (\d+)", e)
            if m and int(m.group(1)) in self.allowed_statuses:
                continue
            out.append(e)
        return out


# Module scope, not session: Playwright's sync API keeps an event loop running in this thread while it is open,
# and a later test elsewhere that calls asyncio.run() would fail ("cannot be called from a running event loop").
@pytest.fixture(scope="module")
def playwright() -> Iterator[Playwright]:
    if sync_playwright is None:
        pytest.skip("playwright is not installed (pip install -e '.[dev]')")
    if not Path(CHROMIUM).exists():
        pytest.skip(f"no Chromium at {CHROMIUM}: install Debian's `chromium` package (.ci/run does)")
    with sync_playwright() as p:
        yield p


@pytest.fixture(scope="module")
def browser(playwright: Playwright) -> Iterator[Browser]:
    b = playwright.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"])
    yield b
    b.close()


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, browser: Browser) -> Iterator[Server]:
    """One real server (SmolLM2, 4 slots) for the browser tests that need no key."""
    srv = start_server(tmp_path_factory.mktemp("browser"), "--slots", "4")
    yield srv
    stop_server(srv)


def open_page(browser: Browser, url: str, console: Console, width: int = 1000) -> Page:
    context = browser.new_context(viewport={"width": width, "height": 760}, accept_downloads=True)
    page = context.new_page()
    page.set_default_timeout(120_000)  # a loaded machine: waits are on events, bounded generously

    def on_console(msg: ConsoleMessage) -> None:
        if msg.type == "error":
            console.errors.append(msg.text)

    page.on("console", on_console)
    page.on("pageerror", lambda exc: console.errors.append(f"uncaught: {exc}"))
    page.goto(url)
    return page


@pytest.fixture
def console() -> Console:
    return Console()


@pytest.fixture
def page(browser: Browser, server: Server, console: Console) -> Iterator[Page]:
    """The playground on the shared server, ready (models listed); no console error may appear."""
    p = open_page(browser, f"{server.url}/", console)
    p.wait_for_selector("body[data-ready='true']")
    yield p
    p.context.close()
    assert console.unexpected() == [], console.errors


def screenshot(page: Page, selector: str, name: str) -> None:
    """Refresh docs/img/NAME.png when SLUICEGATE_SCREENSHOTS=1 (the element only, small)."""
    if os.environ.get("SLUICEGATE_SCREENSHOTS") != "1":
        return
    IMG.mkdir(parents=True, exist_ok=True)
    page.locator(selector).screenshot(path=str(IMG / f"{name}.png"), animations="disabled")
