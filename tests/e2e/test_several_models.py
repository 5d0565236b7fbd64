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
from tests.e2e.conftest import Server, start_server, stop_server


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    gguf = default_model_path()
    srv = start_server(tmp_path_factory.mktemp("two"), "--slots", "4", "--ctx", "1024",
                       "--model", f"main={gguf}", "--model", f"twin={gguf}")
    yield srv
    stop_server(srv)


def chat(url: str, model: str, max_tokens: int = 8, stream: bool = False) -> httpx.Response:
    return httpx.post(f"{url}/v1/chat/completions", timeout=300, json={
        "model": model, "max_tokens": max_tokens, "temperature": 0, "stream": stream,
        "messages": [{"role": "user", "content": "Name three colours."}]})


def test_each_model_answers_by_its_name(pair: Server) -> None:
    names = {m["id"] for m in httpx.get(f"{pair.url}/v1/models", timeout=30).json()["data"]}
    assert names == {"main", "twin"}
    a, b = chat(pair.url, "main").json(), chat(pair.url, "twin").json()
    assert a["model"].startswith("main@") and b["model"].startswith("twin@")
    # the same weights: the same greedy answer from either engine
    assert a["choices"][0]["message"]["content"] == b["choices"][0]["message"]["content"]
    card = httpx.get(f"{pair.url}/v1/models/twin", timeout=30).json()
    assert card["kv"]["slots"] == 4 and card["chat"]["template"] == "model"


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
