"""The playground page: its weight on first load, and its time to first token against curl's on one request.

    flock /work/helpers/bench.lock .venv/bin/python bench/playground.py [--runs 15]

A fresh server on the default model. Weight: a new browser context (empty cache) loads `/` and waits until the
page has listed the models and scraped /metrics once; every response's transfer size (headers + body, as
Chromium counts them) is summed, the page's own files apart from the API calls it makes; then a reload, where
the browser revalidates each file with its ETag. Time to first token:
the same streamed chat request (greedy, 16 tokens, one prompt, so the prefix cache treats every run alike), sent
alternately by curl (`curl -sN`, timed from spawning it to the first content delta on its stdout, so curl's own
start-up is in it) and by the page (timed by the page from the Send click to the first content delta it
painted: fetch, SSE parsing and the DOM update are in it), and, as a baseline without a process start, by
httpx on a kept-alive connection from the bench itself. Medians and p90 in ms.
Needs Chromium at /usr/bin/chromium (or SLUICEGATE_CHROMIUM) and playwright.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import httpx
from playwright.sync_api import Page, Request, sync_playwright

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.common import sluicegate_server
from bench.report import median, percentile

CHROMIUM = os.environ.get("SLUICEGATE_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
PROMPT = "Name three rivers in Europe."
NEW = 16


def request(model: str) -> dict[str, object]:
    return {"model": model, "messages": [{"role": "user", "content": PROMPT}], "max_completion_tokens": NEW,
            "temperature": 0, "stream": True, "stream_options": {"include_usage": True}}


def has_content(line: str) -> bool:
    if not line.startswith("data: {"):
        return False
    choices = json.loads(line[6:]).get("choices") or [{}]
    return bool(choices[0].get("delta", {}).get("content"))


def httpx_ttft(client: httpx.Client, model: str) -> float:
    """A kept-alive connection from this process: the baseline without a process start."""
    t = time.perf_counter()
    first = 0.0
    with client.stream("POST", "/v1/chat/completions", json=request(model)) as r:
        for line in r.iter_lines():
            if not first and has_content(line):
                first = time.perf_counter()
    assert first, "httpx saw no content"
    return (first - t) * 1e3


def curl_ttft(url: str, model: str) -> float:
    body = request(model)
    t = time.perf_counter()
    proc = subprocess.Popen(["curl", "-sN", f"{url}/v1/chat/completions", "-H", "Content-Type: application/json",
                             "-d", json.dumps(body)], stdout=subprocess.PIPE)
    assert proc.stdout is not None
    first = 0.0
    for line in proc.stdout:
        if has_content(line.decode()):
            first = time.perf_counter()
            break
    proc.stdout.read()
    proc.wait(timeout=120)
    assert first, "curl saw no content"
    return (first - t) * 1e3


def page_ttft(page: Page) -> float:
    page.click("#send")
    page.wait_for_selector("#answer[data-state='done']", timeout=120_000)
    return float(page.locator("#answer").get_attribute("data-ttft-ms") or "nan")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=15)
    args = ap.parse_args()
    with sluicegate_server() as url, sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"])
        ctx = browser.new_context(viewport={"width": 1000, "height": 760})
        page = ctx.new_page()
        sizes: list[tuple[str, int]] = []

        def done(req: Request) -> None:
            s = req.sizes()
            sizes.append((req.url.removeprefix(url), s["responseHeadersSize"] + s["responseBodySize"]))

        def load(how: Callable[[], object]) -> list[tuple[str, int]]:
            sizes.clear()
            page.on("requestfinished", done)
            how()
            page.wait_for_selector("body[data-ready='true']")
            page.wait_for_function("() => document.getElementById('stat-running').textContent !== '-'")
            page.remove_listener("requestfinished", done)
            return [(u, n) for u, n in sizes if u == "/" or u.startswith("/playground")]

        own = load(lambda: page.goto(url + "/"))
        api = [(u, n) for u, n in sizes if (u, n) not in own]
        again = load(page.reload)  # the browser revalidates each file: 304s
        model = page.locator("#model").input_value()
        page.fill("#prompt", PROMPT)
        page.fill("#temperature", "0")
        page.fill("#max_tokens", str(NEW))
        curl: list[float] = []
        browser_ms: list[float] = []
        kept: list[float] = []
        with httpx.Client(base_url=url, timeout=120) as client:
            for i in range(args.runs + 3):
                c, b, h = curl_ttft(url, model), page_ttft(page), httpx_ttft(client, model)
                if i >= 3:  # warm-up
                    curl.append(c)
                    browser_ms.append(b)
                    kept.append(h)
        browser.close()
    print(f"page: {len(own)} files, {sum(n for _, n in own)} bytes transferred; at load it also calls "
          f"{len(api)} API routes ({sum(n for _, n in api)} bytes)")
    for u, n in own + api:
        print(f"  {n:>7}  {u}")
    print(f"reload: {len(again)} files, {sum(n for _, n in again)} bytes transferred (revalidated)")
    print("| client | TTFT median (ms) | TTFT p90 (ms) | runs |")
    print("| --- | ---: | ---: | ---: |")
    print(f"| curl -sN | {median(curl):.0f} | {percentile(curl, 0.9):.0f} | {len(curl)} |")
    print(f"| playground page (Chromium) | {median(browser_ms):.0f} | {percentile(browser_ms, 0.9):.0f} "
          f"| {len(browser_ms)} |")
    print(f"| httpx, kept-alive connection | {median(kept):.0f} | {percentile(kept, 0.9):.0f} | {len(kept)} |")
    print(f"page / curl (medians): {median(browser_ms) / median(curl):.2f}x")


if __name__ == "__main__":
    main()
