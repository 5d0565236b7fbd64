"""Deadline admission as a new user meets it: a freshly started server (the real model, over a real socket), a
burst as its first traffic, one client with a modest budget, a burst with no timeout at all.

No test asserts a duration: each waits for its answers and checks what the server did with them (statuses, and
the engine's counters: shed at admission, expired while running). The budgets leave the forecast several times
its answer's idle time, so a loaded machine slows the answers without turning the checks over.
"""

from __future__ import annotations

import asyncio
import re
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from sluicegate.api.routes.metrics import parse_metrics
from tests.e2e.conftest import Server, start_server, stop_server

BANNED_EOS = {"0": -100, "2": -100}  # <|endoftext|>, <|im_end|>: every answer is max_tokens long
RUNNING = 'sluicegate_requests_expired_total{stage="running"}'
SYSTEM = ("You are a careful assistant. Answer briefly, cite no sources, and never invent facts. If a question is "
          "ambiguous, say which reading you answer. Prefer plain words to jargon. ") * 2  # ~100 tokens


@pytest.fixture
def fresh(tmp_path: Path) -> Iterator[Server]:
    """A server nobody has sent anything yet: 8 slots, the model's calibration its only measurement."""
    srv = start_server(tmp_path, "--slots", "8", "--threads", "2")
    yield srv
    stop_server(srv)


def chat(i: int, max_tokens: int = 64) -> dict[str, object]:
    return {"model": "smollm2-135m-instruct", "max_tokens": max_tokens, "temperature": 0, "logit_bias": BANNED_EOS,
            "messages": [{"role": "user", "content": f"Question {i}: tell me one fact about the number {i}."}]}


async def metrics(c: httpx.AsyncClient) -> dict[str, float]:
    return parse_metrics((await c.get("/metrics")).text)


def calibration(srv: Server) -> str:
    """The server's calibration line (for a failure's message: the step times it judged with)."""
    return next((line for line in srv.log_path.read_text().splitlines() if "calibrated" in line), "no calibration")


def budget(srv: Server, at_least: float, times: float) -> float:
    """`at_least` seconds, or `times` an idle answer at the speed the server calibrated, if that is more: on a
    machine slowed by other work the scenario keeps its shape (the budget a few idle answers) instead of turning
    into one where no request can fit (every one 400 `deadline_too_short`)."""
    m = re.search(r"([\d.]+) ms at one sequence, [\d.]+ ms at \d+; ([\d.]+) ms a prompt token", calibration(srv))
    assert m is not None, calibration(srv)
    step_1, token_s = float(m[1]) / 1e3, float(m[2]) / 1e3
    idle = 60 * token_s + 64 * step_1  # a chat prompt of ~50 tokens, 64 new tokens, one sequence
    return round(max(at_least, times * idle), 1)


def model_of(srv: Server) -> str:
    return str(httpx.get(f"{srv.url}/v1/models").json()["data"][0]["id"])


def test_a_cold_burst_is_judged_not_admitted_to_expire(fresh: Server) -> None:
    """40 requests at once as the first traffic, each with 4 s (or 3 idle answers, on a slower machine): the
    forecast judges them from the calibration, so some are answered, the rest are shed at once (503,
    Retry-After), and none expires after compute."""
    name, timeout = model_of(fresh), str(budget(fresh, 4.0, 3.0))

    async def go() -> tuple[list[httpx.Response], dict[str, float]]:
        async with httpx.AsyncClient(base_url=fresh.url, timeout=120) as c:
            bodies = [{**chat(i), "model": name} for i in range(40)]
            rs = await asyncio.gather(*[c.post("/v1/chat/completions", json=b, headers={"X-Request-Timeout": timeout})
                                        for b in bodies])
            return list(rs), await metrics(c)

    rs, m = asyncio.run(go())
    status = Counter(r.status_code for r in rs)
    assert set(status) <= {200, 503}, (status, calibration(fresh))
    assert status[200] >= 1 and status[503] >= 1, (status, calibration(fresh))
    for r in rs:
        if r.status_code == 503:
            assert r.json()["error"]["code"] == "wait_exceeds_deadline" and 1 <= int(r.headers["retry-after"]) <= 60
    assert m["sluicegate_requests_shed_total"] == status[503]
    assert m[RUNNING] == 0 and m['sluicegate_requests_expired_total{stage="queued"}'] == 0
    assert m["sluicegate_goodput_tokens_total"] == 64 * status[200]


def test_one_client_alone_is_always_answered(fresh: Server) -> None:
    """One client, one request at a time, 8 s each for an answer a quiet server gives in under a second (and this
    shared machine, busy, in ~3 s): every one answered. A forecast that learned from the slow first prefill said
    10 s and refused from the third on. (The 4 s budget of the same scenario is measured in bench/overload.py:
    here it would assert a speed.)"""
    name, timeout = model_of(fresh), str(budget(fresh, 8.0, 6.0))
    with httpx.Client(base_url=fresh.url, timeout=120) as c:
        for i in range(8):
            r = c.post("/v1/chat/completions", json={**chat(i), "model": name}, headers={"X-Request-Timeout": timeout})
            assert r.status_code == 200, r.text
        m = parse_metrics(c.get("/metrics").text)
    assert m["sluicegate_requests_shed_total"] == 0 and m["sluicegate_forecast_error_ratio_count"] == 8
    assert m["sluicegate_admission_forecast_error_ratio_count"] == 8


def test_requests_without_a_timeout_are_never_refused(tmp_path: Path) -> None:
    """No timeout header: the server's cap (`--max-timeout`, 5 s here) ends a request that outlives it, but no
    forecast refuses one. Two sequential requests, then 16 at once sharing a 100-token prefix: none refused
    (503 or 4xx); each answered, or cut by the cap (504) if the machine is that slow."""
    srv = start_server(tmp_path, "--slots", "8", "--threads", "2", "--max-timeout", "5",
                       "--upstream-attempt-timeout", "2")  # (upstream retries must fit the cap: none is used)
    try:
        async def go() -> list[httpx.Response]:
            async with httpx.AsyncClient(base_url=srv.url, timeout=600) as c:
                def one(i: int) -> dict[str, object]:
                    return {"prompt": f"{SYSTEM}Question {i}: name a colour.", "max_new_tokens": 40, "temperature": 0}
                first = [await c.post("/v1/generate", json=one(i)) for i in range(2)]
                return first + list(await asyncio.gather(*[c.post("/v1/generate", json=one(i)) for i in range(16)]))

        rs = asyncio.run(go())
        m = parse_metrics(httpx.get(f"{srv.url}/metrics").text)
    finally:
        stop_server(srv)
    status = Counter(r.status_code for r in rs)
    assert set(status) <= {200, 504}, [r.text for r in rs if r.status_code not in (200, 504)]
    assert m["sluicegate_requests_shed_total"] == 0
