"""Two local models in one process over a real socket (`--model main=GGUF --model twin=GGUF`): each answers by its name,
and a lone request to one is answered while the other runs streams (their forward passes take turns through
one lock, so neither stalls the other at llama.cpp's thread barriers)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from sluicegate.backends.llama_cpp import default_model_path
from sluicegate.testing.wait import wait_for
from tests.e2e.conftest import Server, start_server, stop_server


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    gguf = default_model_path()
    srv = start_server(tmp_path_factory.mktemp("two"), "--slots", "4", "--ctx", "1024",
                       "--model", f"main={gguf}", "--model", f"twin={gguf}", "--model-option", "twin:ctx=512")
    yield srv
    stop_server(srv)


def chat(url: str, model: str, max_tokens: int = 8, stream: bool = False) -> httpx.Response:
    return httpx.post(f"{url}/v1/chat/completions", timeout=300, json={
        "model": model, "max_tokens": max_tokens, "temperature": 0, "stream": stream,
        "messages": [{"role": "user", "content": "Name three colours."}]})


def states(url: str) -> dict[str, str]:
    return {m["id"]: m["state"] for m in httpx.get(f"{url}/v1/models", timeout=120).json()["data"]}


def test_each_model_answers_by_its_name(pair: Server) -> None:
    names = {m["id"] for m in httpx.get(f"{pair.url}/v1/models", timeout=30).json()["data"]}
    assert names == {"main", "twin"}
    a, b = chat(pair.url, "main").json(), chat(pair.url, "twin").json()
    assert a["model"].startswith("main@") and b["model"].startswith("twin@")
    # the same weights: the same greedy answer from either engine
    assert a["choices"][0]["message"]["content"] == b["choices"][0]["message"]["content"]
    card = httpx.get(f"{pair.url}/v1/models/twin", timeout=30).json()
    assert card["kv"]["slots"] == 4 and card["chat"]["template"] == "model"
    assert card["context_window"] == 512  # its own window (--model-option twin:ctx=512), the server's for main
    assert httpx.get(f"{pair.url}/v1/models/main", timeout=30).json()["context_window"] == 1024


def test_a_lone_request_to_one_model_is_answered_while_the_other_is_busy(pair: Server) -> None:
    done: list[int] = []

    def busy() -> None:
        done.append(chat(pair.url, "main", max_tokens=96, stream=True).status_code)

    threads = [threading.Thread(target=busy) for _ in range(4)]
    for t in threads:
        t.start()
    lone = chat(pair.url, "twin", max_tokens=8)
    for t in threads:
        t.join()
    assert lone.status_code == 200 and lone.json()["choices"][0]["message"]["content"]
    assert done == [200] * 4


def test_a_second_model_without_a_name_is_refused(tmp_path: Path) -> None:
    import subprocess
    import sys

    gguf = str(default_model_path())
    r = subprocess.run([sys.executable, "-m", "sluicegate", "serve", "--model", gguf, "--model", gguf,
                        "--data-dir", str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "needs a name" in r.stderr


def test_a_budget_that_holds_one_model_alternates_them_with_the_answers_of_one_alone(
        tmp_path_factory: pytest.TempPathFactory, server: Server) -> None:
    """Two names for the bundled GGUF under a budget that holds one: each request loads its model (unloading the
    other), none fails, and each answer is the one a server with that model alone gives (`server`)."""
    gguf = default_model_path()
    size = gguf.stat().st_size
    srv = start_server(tmp_path_factory.mktemp("budget"), "--slots", "2", "--ctx", "512",
                       "--model", f"main={gguf}", "--model", f"twin={gguf}",
                       "--models-memory-bytes", str(int(size * 1.6)))
    try:
        card = httpx.get(f"{srv.url}/v1/models/twin", timeout=30).json()
        cost = size + card["kv"]["slots"] * card["kv"]["bytes_per_slot"]
        assert cost <= size * 1.6 < 2 * cost  # the budget holds one model, not two
        assert card["state"] == "unloaded"
        alone = httpx.get(f"{server.url}/v1/models", timeout=30).json()["data"][0]["id"]
        want = chat(server.url, alone).json()["choices"][0]["message"]["content"]
        for name in ("twin", "main", "twin", "main"):
            r = chat(srv.url, name)
            assert r.status_code == 200, r.text
            assert r.json()["choices"][0]["message"]["content"] == want
            assert states(srv.url) == {name: "loaded", ("main" if name == "twin" else "twin"): "unloaded"}
        metrics = httpx.get(f"{srv.url}/metrics", timeout=30).text
        assert 'sluicegate_model_unloads_total{model_name="main",reason="budget"} 2.0' in metrics
        # a stream holds its model: a request for the other waits for room instead of unloading it mid-stream
        with httpx.stream("POST", f"{srv.url}/v1/chat/completions", timeout=300, json={
                "model": "main", "max_tokens": 48, "temperature": 0, "stream": True,
                "messages": [{"role": "user", "content": "Count from one to twenty."}]}) as stream:
            lines = stream.iter_lines()
            first = next(lines)
            other: list[httpx.Response] = []
            waiting = threading.Thread(target=lambda: other.append(chat(srv.url, "twin")))
            waiting.start()
            wait_for(lambda: states(srv.url)["twin"] == "loading")
            assert states(srv.url)["main"] == "loaded"
            rest = [line for line in (first, *lines) if line]
        waiting.join(timeout=300)
        assert rest[-1] == "data: [DONE]" and not any('"error"' in line for line in rest)
        assert other and other[0].status_code == 200
        assert states(srv.url) == {"twin": "loaded", "main": "unloaded"}
    finally:
        stop_server(srv)
