"""The playground page in a real browser (system Chromium), against the real server and model.

Every wait is on the page: a selector, an attribute the page sets, or a function over the DOM; never a sleep.
Each test also asserts that the page logged no console error (the `page` fixture), apart from the refusals a
test provokes on purpose.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from playwright.sync_api import Browser, Page, expect

from tests.browser.conftest import Console, open_page, screenshot
from tests.e2e.conftest import Server, start_server, stop_server

WAIT = 120_000  # ms: a bound for a loaded two-core machine, not a speed claim
# The model's end-of-text tokens banned, so the answer runs until it is stopped.
ENDLESS = json.dumps({"logit_bias": {"0": -100, "2": -100}})


def stat(page: Page, name: str) -> int:
    page.wait_for_function(f"() => document.getElementById('stat-{name}').textContent !== '-'")
    return int(page.locator(f"#stat-{name}").inner_text())


def test_a_streamed_answer_appears_token_by_token_and_stops(page: Page) -> None:
    cancelled_before = stat(page, "cancelled")
    page.fill("#prompt", "Count from one to two thousand, one number per line.")
    page.fill("#temperature", "0")
    page.fill("#max_tokens", "1500")
    page.fill("#extra", ENDLESS)
    page.press("#prompt", "Control+Enter")  # the keyboard sends
    page.wait_for_selector("#answer[data-state='streaming']")
    # token by token: the text grows over several events while the stream is still open
    page.wait_for_function("() => { const a = document.getElementById('answer');"
                           " return Number(a.dataset.chunks) >= 5 && a.dataset.state === 'streaming'; }")
    grown = page.locator("#answer").inner_text()
    page.wait_for_function("(n) => document.getElementById('answer').textContent.length > n", arg=len(grown))
    page.keyboard.press("Escape")  # the keyboard stops
    expect(page.locator("#answer")).to_have_attribute("data-state", "stopped")
    assert page.locator("#stop-btn").is_disabled()
    # the engine ended the run: its own counters, as the page's metrics panel reads them from /metrics
    page.click("#tab-metrics")
    expect(page.locator("#stat-cancelled")).to_have_text(str(cancelled_before + 1), timeout=WAIT)
    expect(page.locator("#stat-running")).to_have_text("0", timeout=WAIT)
    chunks = int(page.locator("#answer").get_attribute("data-chunks") or 0)
    assert 5 <= chunks < 1500


def test_a_refusal_shows_its_envelope_with_the_parameter(page: Page, console: Console) -> None:
    console.allowed_statuses.add(400)
    page.fill("#temperature", "5")
    page.uncheck("#stream")
    page.click("#send")
    expect(page.locator("#answer")).to_have_attribute("data-state", "refused", timeout=WAIT)
    refusal = page.locator("#refusal")
    expect(refusal).to_be_visible()
    expect(refusal.locator(".param")).to_have_text("parameter: temperature")
    envelope = json.loads(refusal.locator("pre").inner_text())
    assert envelope["error"]["param"] == "temperature"
    assert envelope["error"]["type"] == "invalid_request_error" and envelope["error"]["request_id"].startswith("req_")
    # the inspector: the exact request, as curl and as SDK code, and the raw answer with its headers
    page.click("#tab-inspect")
    curl = page.locator("#as-curl").inner_text()
    assert "/v1/chat/completions" in curl and '"temperature":5' in curl
    python = page.locator("#as-python").inner_text()
    assert "client.chat.completions.create(" in python and "temperature=5," in python
    expect(page.locator("#resp-status")).to_contain_text("400")
    headers = page.locator("#resp-headers").inner_text()
    assert f"x-request-id: {envelope['error']['request_id']}" in headers and "server-timing:" in headers
    screenshot(page, "main", "inspector")


def test_a_json_schema_answer_parses_and_shows_identity_usage_timing(page: Page, server: Server) -> None:
    page.select_option("#mode", "json_schema")
    page.fill("#prompt", "Give a city and its population as JSON.")
    page.fill("#temperature", "0")
    page.fill("#max_tokens", "120")
    page.uncheck("#stream")
    page.check("#show-ids")
    page.click("#send")
    expect(page.locator("#answer")).to_have_attribute("data-state", "done", timeout=WAIT)
    answer = json.loads(page.locator("#answer").inner_text())
    assert isinstance(answer["city"], str) and isinstance(answer["population"], int)
    model = page.locator("#model").input_value()
    assert page.locator("dd[data-field='model']").inner_text().startswith(f"{model}@")
    assert page.locator("dd[data-field='digest']").inner_text().startswith("sha256:")
    assert "cached" in page.locator("dd[data-field='usage']").inner_text()
    bar = page.locator("#timing span")
    expect(bar).to_have_count(3)
    assert page.locator("#timing").get_attribute("data-source", timeout=WAIT).startswith("Server-Timing")
    expect(page.locator("#token-ids")).to_contain_text("answer token ids", timeout=WAIT)
    prompt_tokens = int(page.locator("dd[data-field='usage']").inner_text().split()[0])
    assert page.locator("#token-ids").get_attribute("data-prompt-count") == str(prompt_tokens)
    screenshot(page, "main", "chat")


def test_a_streamed_tool_call_shows_its_arguments(page: Page) -> None:
    page.select_option("#mode", "tools")
    page.fill("#prompt", "What is the weather in Paris?")
    page.fill("#temperature", "0")
    page.fill("#max_tokens", "60")
    page.click("#send")
    expect(page.locator("#answer")).to_have_attribute("data-state", "done", timeout=WAIT)
    name, _, args = page.locator("#answer").inner_text().partition("(")
    assert name == "get_weather"
    assert isinstance(json.loads(args.removesuffix(")"))["city"], str)
    expect(page.locator("dd[data-field='finish']")).to_have_text("tool_calls")
    # the inspector has the raw SSE events of the stream
    page.click("#tab-inspect")
    body = page.locator("#resp-body").inner_text()
    assert body.startswith("data: {") and body.rstrip().endswith("data: [DONE]") and '"tool_calls"' in body
    assert "tool_choice=\"required\"," in page.locator("#as-python").inner_text()


def test_a_batch_job_runs_to_100_percent(page: Page, server: Server) -> None:
    model = page.locator("#model").input_value()
    lines = [json.dumps({"custom_id": f"r{i}", "method": "POST", "url": "/v1/chat/completions",
                         "body": {"model": model, "messages": [{"role": "user", "content": f"Say {i}."}],
                                  "max_completion_tokens": 4, "temperature": 0}}) for i in range(3)]
    page.click("#tab-batches")
    page.set_input_files("#batch-file", files=[{"name": "three.jsonl", "mimeType": "application/jsonl",
                                                "buffer": ("\n".join(lines) + "\n").encode()}])
    page.click("#batch-form button[type='submit']")
    expect(page.locator("#batch-message")).to_contain_text("started batch_", timeout=WAIT)
    batch_id = page.locator("#batch-message").inner_text().split()[1]
    row = page.locator(f"tr[data-id='{batch_id}']")
    expect(row.locator("progress")).to_have_attribute("data-percent", "100", timeout=WAIT)
    expect(row).to_have_attribute("data-status", "completed", timeout=WAIT)
    screenshot(page, "main", "batches")
    with page.expect_download() as done:
        row.get_by_role("button", name="results").click()
    out = Path(done.value.path()).read_text().splitlines()
    assert sorted(json.loads(line)["custom_id"] for line in out) == ["r0", "r1", "r2"]


def test_a_running_batch_shows_an_eta_and_can_be_cancelled(page: Page) -> None:
    model = page.locator("#model").input_value()
    body = {"model": model, "messages": [{"role": "user", "content": "Count to a thousand."}],
            "max_completion_tokens": 200, "temperature": 0, "logit_bias": {"0": -100, "2": -100}}
    lines = [json.dumps({"custom_id": f"r{i}", "method": "POST", "url": "/v1/chat/completions",
                         "body": {**body, "max_completion_tokens": 8 if i == 0 else 200}}) for i in range(40)]
    page.click("#tab-batches")
    page.set_input_files("#batch-file", files=[{"name": "long.jsonl", "mimeType": "application/jsonl",
                                                "buffer": ("\n".join(lines) + "\n").encode()}])
    page.click("#batch-form button[type='submit']")
    expect(page.locator("#batch-message")).to_contain_text("started batch_", timeout=WAIT)
    row = page.locator(f"tr[data-id='{page.locator('#batch-message').inner_text().split()[1]}']")
    expect(row.locator("td").nth(3)).to_have_text(re.compile(r"^\d+ s$"), timeout=WAIT)  # an item has ended
    row.get_by_role("button", name="cancel").click()
    expect(row).to_have_attribute("data-status", "cancelled", timeout=WAIT)
    assert int(row.locator("progress").get_attribute("data-percent") or 100) < 100


def test_the_metrics_plots_draw(page: Page) -> None:
    page.fill("#max_tokens", "8")
    page.click("#send")  # some traffic, so the latency histograms have observations
    expect(page.locator("#answer")).to_have_attribute("data-state", "done", timeout=WAIT)
    page.click("#tab-metrics")
    for plot in ("ttft", "itl", "tps", "queue"):  # a few scrapes: lines, not single points
        page.wait_for_function(f"() => Number(document.getElementById('plot-{plot}').dataset.points) >= 3",
                               timeout=WAIT)
    # the TTFT line is on the canvas: some pixel is its colour (#1d5fa8), not only axes and text
    drawn = page.evaluate("""() => { const c = document.getElementById('plot-ttft');
        const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
        for (let i = 0; i < d.length; i += 4)
            if (d[i] < 60 && d[i + 1] > 70 && d[i + 1] < 120 && d[i + 2] > 140) return true;
        return false; }""")
    assert drawn
    screenshot(page, "main", "metrics")


def test_keyboard_and_a_narrow_window(browser: Browser, server: Server, console: Console) -> None:
    page = open_page(browser, f"{server.url}/playground", console, width=360)
    try:
        page.wait_for_selector("body[data-ready='true']")
        assert page.evaluate("document.documentElement.scrollWidth <= window.innerWidth")
        expect(page.locator("#schema-label")).to_be_hidden()  # only with a JSON schema or tools
        page.select_option("#mode", "tools")
        expect(page.locator("#schema")).to_have_value(re.compile("get_weather"))
        page.select_option("#mode", "text")
        expect(page.locator("#schema-label")).to_be_hidden()
        page.focus("#tab-chat")
        page.keyboard.press("ArrowRight")
        expect(page.locator("#panel-inspect")).to_be_visible()
        expect(page.locator("#tab-inspect")).to_be_focused()
        page.keyboard.press("ArrowLeft")
        expect(page.locator("#panel-chat")).to_be_visible()
    finally:
        page.context.close()
    assert console.unexpected() == [], console.errors


def create_key(data: Path, *scopes: str, tpm: int | None = None) -> str:
    """A key made as an operator makes one (`sluicegate keys create`); its secret is the output's last line."""
    limit = ["--tpm", str(tpm)] if tpm else []
    made = subprocess.run([sys.executable, "-m", "sluicegate", "keys", "create", "--name", "browser", *limit,
                           *(a for s in scopes for a in ("--scope", s)), "--data-dir", str(data)],
                          capture_output=True, text=True, timeout=120, check=True)
    return made.stdout.splitlines()[-1]


@dataclass
class Keyed:
    server: Server
    data: Path  # its store's data directory

    def key(self, *scopes: str, tpm: int | None = None) -> str:
        return create_key(self.data, *scopes, tpm=tpm)


@pytest.fixture(scope="module")
def keyed(tmp_path_factory: pytest.TempPathFactory, browser: Browser) -> Iterator[Keyed]:
    """A server whose store holds a key from the start: auth is on."""
    data = tmp_path_factory.mktemp("keyed") / "data"
    create_key(data, "generate")
    srv = start_server(data.parent, "--data-dir", str(data), "--slots", "2")
    yield Keyed(srv, data)
    stop_server(srv)


def test_a_keyed_server_asks_for_a_key_and_keeps_it_in_the_session(
    browser: Browser, keyed: Keyed, console: Console
) -> None:
    server, secret = keyed.server, keyed.key("generate", "metrics", tpm=100_000)
    console.allowed_statuses.add(401)  # the page's first look at /v1/models, without a key
    page = open_page(browser, f"{server.url}/", console)
    try:
        page.wait_for_selector("body[data-auth='needed']")
        expect(page.locator("#key-panel")).to_be_visible()
        expect(page.locator("#key-reason")).to_contain_text("requires an API key")
        screenshot(page, "#key-panel", "key")
        page.fill("#key-input", secret)
        page.press("#key-input", "Enter")
        page.wait_for_selector("body[data-ready='true']")
        expect(page.locator("#key-panel")).to_be_hidden()
        assert page.evaluate("sessionStorage.getItem('sluicegate.key')") == secret
        assert page.evaluate("localStorage.length") == 0 and page.context.cookies() == []
        page.fill("#max_tokens", "4")
        page.click("#send")
        expect(page.locator("#answer")).to_have_attribute("data-state", "done", timeout=WAIT)
        page.click("#tab-inspect")
        shown = page.locator("#panel-inspect").inner_text()
        assert secret not in shown and "$SLUICEGATE_API_KEY" in shown  # the secret never appears on screen
        headers = page.locator("#resp-headers").inner_text()
        assert "x-ratelimit-limit-tokens: 100000" in headers and "x-ratelimit-remaining-tokens:" in headers
    finally:
        page.context.close()
    assert console.unexpected() == [], console.errors
    # another tab (a new browsing context) has no key: sessionStorage only
    again = open_page(browser, f"{server.url}/", Console())
    try:
        again.wait_for_selector("body[data-auth='needed']")
    finally:
        again.context.close()


def test_a_key_without_the_metrics_scope_is_told_so(
    browser: Browser, keyed: Keyed, console: Console
) -> None:
    server, secret = keyed.server, keyed.key("generate")
    console.allowed_statuses |= {401, 403}  # the first look without a key; /metrics without its scope
    page = open_page(browser, f"{server.url}/", console)
    try:
        page.wait_for_selector("body[data-auth='needed']")
        page.fill("#key-input", secret)
        page.press("#key-input", "Enter")
        page.wait_for_selector("body[data-ready='true']")
        page.click("#tab-metrics")
        expect(page.locator("#metrics-message")).to_contain_text("/metrics refused", timeout=WAIT)
        expect(page.locator("#metrics-message")).to_contain_text("'metrics' scope")
    finally:
        page.context.close()
    assert console.unexpected() == [], console.errors
