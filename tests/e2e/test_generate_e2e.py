"""The real server over a real socket: the /v1/generate contract, fidelity to the engine, health under load."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

from tests.e2e.conftest import Server

HERE = Path(__file__).parent

PROMPTS = [
    "The capital of France is",
    "Write a haiku about the sea.",
    "def fibonacci(n):",
    "List three colours:",
    "Once upon a time",
    "The quick brown fox",
    "Translate to French: good morning",
    "2 + 2 =",
    "Le ciel est",
    "東京は日本の",
    "Emoji story: 🐱🚀",
    "Explain gravity in one sentence.",
    "A recipe for pancakes needs",
    "The best way to learn Python is",
    "SELECT * FROM",
    "Dear diary, today",
    "Привет, как дела?",
    "The meaning of life is",
    "In 1969, humans",
    "Q: What is a prime number?\nA:",
]


def post(server: Server, body: dict, **kw: object) -> httpx.Response:
    return httpx.post(f"{server.url}/v1/generate", json=body, timeout=120, **kw)


def test_response_contract(server: Server) -> None:
    r = post(server, {"prompt": "The capital of France is", "max_new_tokens": 8, "temperature": 0},
             headers={"X-Request-Id": "e2e-contract-1"})
    assert r.status_code == 200
    body = r.json()
    assert body["id"] == r.headers["x-request-id"] == "e2e-contract-1"
    assert body["object"] == "generation"
    assert abs(body["created"] - time.time()) < 120
    assert body["model"]["name"] == "smollm2-135m-instruct"
    assert body["model"]["version"] == "q4_1"
    assert body["model"]["digest"].startswith("sha256:") and len(body["model"]["digest"]) == 71
    assert body["finish_reason"] in ("length", "eos", "stop")
    assert 1 <= len(body["token_ids"]) <= 8
    u = body["usage"]
    assert u["completion_tokens"] == len(body["token_ids"])
    assert u["total_tokens"] == u["prompt_tokens"] + u["completion_tokens"]
    t = body["timing"]
    assert all(t[k] >= 0 for k in ("queue_ms", "prefill_ms", "decode_ms", "total_ms"))
    assert t["total_ms"] >= t["prefill_ms"]
    assert "total;dur=" in r.headers["server-timing"]
    assert body["warnings"] == []


def test_stop_string_and_warnings(server: Server) -> None:
    r = post(server, {"prompt": "Count: 1, 2, 3,", "max_new_tokens": 30, "temperature": 0, "stop": [","], "top_k": 5})
    body = r.json()
    assert r.status_code == 200
    assert body["finish_reason"] == "stop"
    assert "," not in body["text"]
    assert any("top_k" in w for w in body["warnings"])


def test_unknown_model_is_404(server: Server) -> None:
    r = post(server, {"prompt": "hi", "model": "gpt-4"})
    assert r.status_code == 404
    assert r.json()["error"]["type"] == "model_not_found"
    ok = post(server, {"prompt": "hi", "model": "smollm2-135m-instruct@q4_1", "max_new_tokens": 1})
    assert ok.status_code == 200


def _service_results(server: Server, requests: list[dict]) -> list[dict]:
    out = []
    for req in requests:
        r = post(server, req)
        assert r.status_code == 200, r.text
        out.append(r.json())
    return out


@pytest.mark.timeout(900)
def test_fidelity_http_equals_engine_in_another_process(server: Server) -> None:
    requests = [
        {"prompt": p, "max_new_tokens": 24, "temperature": 0.0} for p in PROMPTS
    ] + [
        {"prompt": p, "max_new_tokens": 24, "temperature": 1.0, "seed": 1000 + i} for i, p in enumerate(PROMPTS)
    ]
    served = _service_results(server, requests)
    proc = subprocess.run(
        [sys.executable, str(HERE / "direct_engine.py")], input=json.dumps({"requests": requests}),
        capture_output=True, text=True, timeout=800, check=True,
    )
    direct = json.loads(proc.stdout)
    assert len(direct) == len(served) == 40
    for i, (s, d) in enumerate(zip(served, direct, strict=True)):
        assert s["token_ids"] == d["token_ids"], f"request {i}: token ids differ"
        assert s["text"] == d["text"], f"request {i}: text differs"
        assert s["usage"]["prompt_tokens"] == d["independent_prompt_tokens"]
        assert s["usage"]["completion_tokens"] == len(d["token_ids"])
        assert s["finish_reason"] == d["finish_reason"]


def test_health_answers_fast_during_a_long_generation(server: Server) -> None:
    done = threading.Event()
    result: dict[str, int] = {}

    model = httpx.get(f"{server.url}/v1/models", timeout=10).json()["data"][0]["id"]

    def generate() -> None:
        # end-of-text banned: the generation runs its full 256 tokens whatever the sampler draws
        body = {"model": model, "prompt": "Tell me a very long story about dragons.", "max_tokens": 256,
                "temperature": 1.0, "seed": 7, "logit_bias": {"0": -100, "2": -100}}
        r = httpx.post(f"{server.url}/v1/completions", json=body, timeout=300)
        result["status"] = r.status_code
        result["tokens"] = r.json()["usage"]["completion_tokens"]
        done.set()

    worker = threading.Thread(target=generate)
    worker.start()
    latencies = []
    with httpx.Client(base_url=server.url, timeout=10) as c:
        time.sleep(0.3)  # let the generation start
        while not done.is_set() and len(latencies) < 50:
            t = time.perf_counter()
            assert c.get("/healthz").status_code == 200
            latencies.append(time.perf_counter() - t)
            time.sleep(0.02)
    worker.join(timeout=300)
    assert result["status"] == 200 and result["tokens"] == 256
    assert len(latencies) >= 5, "the generation ended before health could be measured"
    assert max(latencies) < 0.2, f"slowest health check took {max(latencies) * 1e3:.1f} ms"
