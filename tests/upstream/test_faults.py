"""The upstream hop against a fault-injecting fake (tests/upstream/fake.py): every fault gives its documented
status or event (docs/upstream.md), nothing hangs, and no retry outlives the caller's budget."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import httpx
import pytest

from sluicegate.api.app import create_app
from sluicegate.backends.reference import ReferenceRunner
from sluicegate.config import Config, UpstreamConfig, UpstreamTarget
from sluicegate.testing.wait import wait_for
from tests.upstream.fake import FakeUpstream, serve

Make = Callable[..., Any]


@contextmanager
def stack(fake: FakeUpstream, *, local: bool = False, script: tuple[str, ...] = (), also: FakeUpstream | None = None,
          **ladder: Any) -> Iterator[str]:
    """The fake on a socket, and a sluicegate whose model `fake` it serves (tokenizer: the reference's);
    `script` is the fake's behaviours once the start-up probe is done; `also`, a second URL for `fake`."""
    with serve(fake) as fake_url, serve(also or FakeUpstream()) as also_url:
        fake.url = fake_url
        urls = [fake_url] + ([also_url] if also is not None else [])
        cfg = UpstreamConfig(targets=tuple(UpstreamTarget("fake", f"{u}/v1") for u in urls), local_model=local,
                             **{"backoff_s": 0.01, **ladder})
        app = create_app(Config(upstream=cfg), lambda: ReferenceRunner(n_ctx=512, n_slots=2))
        with serve(app) as url:
            wait_for(lambda: _loaded(url), 60, message="the upstream model to load")
            for f in (fake, also):
                if f is not None:
                    f.arrivals.clear()  # the start-up probe's request
                    f.auth.clear()
                    f.traceparents.clear()
            fake.script = list(script)
            yield url


def _loaded(url: str) -> bool:
    r = httpx.get(f"{url}/readyz", timeout=5)
    return r.status_code == 200 or r.json()["error"]["code"] == "load_failed"


def gen(url: str, deadline: float | None = None, **body: Any) -> httpx.Response:
    headers = {} if deadline is None else {"X-Request-Timeout": str(deadline)}  # the caller's budget
    payload = {"prompt": "Hello there", "max_new_tokens": 4, "temperature": 0, "model": "fake", **body}
    return httpx.post(f"{url}/v1/generate", json=payload, headers=headers, timeout=60)


def error(r: httpx.Response) -> dict[str, Any]:
    err = r.json()["error"]
    assert err["request_id"] == r.headers["x-request-id"]
    assert "secret upstream detail" not in r.text and "not json" not in r.text
    return dict(err)


@pytest.fixture
def fake() -> FakeUpstream:
    return FakeUpstream()


def test_a_healthy_upstream_answers_with_its_ids_usage_and_the_configured_identity(fake: FakeUpstream) -> None:
    with stack(fake) as url:
        r = gen(url)
        assert r.status_code == 200, r.text
        body = r.json()
        want = fake.tokenizer.tokenize(" the fake upstream says hello", add_special=False)[:4]
        assert body["token_ids"] == want
        assert body["usage"]["prompt_tokens"] == len(fake.tokenizer.tokenize("Hello there"))
        assert body["usage"]["completion_tokens"] == 4 and body["finish_reason"] == "length"
        assert body["model"] == {"name": "fake", "version": "upstream", "digest": "unknown"}
        assert fake.completions() == ["ok"]


def test_503_then_success_is_retried_once(fake: FakeUpstream) -> None:
    with stack(fake, script=("status:503",)) as url:
        r = gen(url)
        assert r.status_code == 200, r.text
        assert fake.completions() == ["status:503", "ok"]


def test_retries_stop_at_the_configured_count(fake: FakeUpstream) -> None:
    with stack(fake, script=("status:503",) * 5, retries=1) as url:
        r = gen(url)
        assert r.status_code == 503 and error(r)["type"] == "upstream_unavailable"
        assert int(r.headers["retry-after"]) >= 1
        assert fake.completions() == ["status:503", "status:503"]


def test_no_retry_that_cannot_finish_inside_the_callers_budget(fake: FakeUpstream) -> None:
    with stack(fake, script=("status:503",) * 5, retries=3, attempt_timeout_s=5.0) as url:
        sent = time.monotonic()
        r = gen(url, deadline=2.0)  # a retry would need a whole 5 s attempt: none is made
        assert r.status_code == 503 and error(r)["type"] == "upstream_unavailable"
        assert fake.completions() == ["status:503"]
        assert all(t < sent + 2.0 for t, _ in fake.arrivals)


def test_a_slow_first_byte_is_an_upstream_timeout_and_not_retried(fake: FakeUpstream) -> None:
    with stack(fake, script=("slow_first",), attempt_timeout_s=0.5, connect_timeout_s=0.5) as url:
        r = gen(url)
        assert r.status_code == 504 and error(r)["type"] == "upstream_timeout"
        assert fake.completions() == ["slow_first"]
        _eventually(lambda: fake.left == ["slow_first"])  # the upstream request was closed


def test_a_hang_ends_at_the_callers_deadline_with_one_attempt(fake: FakeUpstream) -> None:
    with stack(fake, script=("hang",) * 3, attempt_timeout_s=30.0) as url:
        r = gen(url, deadline=3.0)
        assert r.status_code == 504 and error(r)["type"] == "deadline_exceeded"
        assert fake.completions() == ["hang"]
        _eventually(lambda: fake.left == ["hang"])


def test_a_streams_first_token_deadline_ends_a_hang_with_one_attempt(fake: FakeUpstream) -> None:
    """An SDK's read timeout bounds only a stream's first token (docs/timeouts.md): the ladder waits no longer
    for it than that, though its attempt timeout is far longer, and makes no retry that cannot fit it."""
    with stack(fake, script=("hang",) * 3, attempt_timeout_s=30.0) as url:
        body = {"model": "fake", "prompt": "Hello", "max_tokens": 4, "temperature": 0, "stream": True}
        with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=60,
                          headers={"x-stainless-read-timeout": "2"}) as r:
            events = _events(r.iter_lines())
        assert r.status_code == 200 and events[-1] == ("", "[DONE]")
        kind, data = events[-2]
        assert kind == "error" and json.loads(data)["error"]["type"] == "deadline_exceeded"
        assert fake.completions() == ["hang"]
        _eventually(lambda: fake.left == ["hang"])


@pytest.mark.parametrize("fault", ["malformed", "no_usage", "wrong_usage", "status:400", "status:500"])
def test_a_broken_answer_is_a_502_in_our_envelope(fake: FakeUpstream, fault: str) -> None:
    with stack(fake, script=(fault,)) as url:
        r = gen(url)
        assert r.status_code == 502 and error(r)["type"] == "upstream_error"
        assert fake.completions() == [fault]  # none of these is retried


def test_a_drop_mid_stream_ends_with_a_typed_error_event_then_done(fake: FakeUpstream) -> None:
    with stack(fake, script=("drop",)) as url:
        body = {"model": "fake", "prompt": "Hello", "max_tokens": 4, "temperature": 0, "stream": True}
        with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=60) as r:
            assert r.status_code == 200
            events = _events(r.iter_lines())
        assert events[-1] == ("", "[DONE]")
        kind, data = events[-2]
        assert kind == "error" and json.loads(data)["error"]["type"] == "upstream_error"
        assert any(k == "" and d != "[DONE]" and json.loads(d)["choices"] for k, d in events[:-2])


def test_a_failing_upstream_opens_its_circuit_to_a_fast_503(fake: FakeUpstream) -> None:
    with stack(fake, script=("status:503",) * 2, retries=0, breaker_failures=2, breaker_open_s=60.0) as url:
        assert [gen(url).status_code for _ in range(2)] == [503, 503]
        r = gen(url)
        assert r.status_code == 503 and error(r)["code"] == "circuit_open"
        assert 1 <= int(r.headers["retry-after"]) <= 60
        assert fake.completions() == ["status:503", "status:503"]  # the open circuit sent nothing


def test_a_client_that_leaves_closes_the_upstream_request(fake: FakeUpstream) -> None:
    with stack(fake, script=("slow_first",), attempt_timeout_s=60.0) as url:
        body = {"model": "fake", "prompt": "Hello", "max_tokens": 4, "stream": True}
        with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=60) as r:
            assert r.status_code == 200
            _eventually(lambda: fake.completions() == ["slow_first"])
        _eventually(lambda: fake.left == ["slow_first"])


def test_an_upstream_without_usage_is_refused_at_start_up(fake: FakeUpstream) -> None:
    fake.default = "no_usage"
    with stack(fake) as url:
        r = httpx.get(f"{url}/readyz")
        assert r.status_code == 503 and r.json()["error"]["code"] == "load_failed"


def test_without_token_ids_generate_says_so_and_completions_serves(fake: FakeUpstream) -> None:
    fake.default = "no_ids"
    with stack(fake) as url:
        r = gen(url)
        assert r.status_code == 422 and error(r)["code"] == "unsupported_for_model"
        body = {"model": "fake", "prompt": "Hello", "max_tokens": 3, "temperature": 0}
        c = httpx.post(f"{url}/v1/completions", json=body, timeout=60)
        assert c.status_code == 200 and c.json()["usage"]["completion_tokens"] == 3
        # logprobs named by text cannot be mapped onto our vocabulary: refused up front, never a 502 mid-answer
        lp = httpx.post(f"{url}/v1/completions", json={**body, "logprobs": 1}, timeout=60)
        assert lp.status_code == 400 and error(lp)["code"] == "unsupported_for_model"
        assert error(lp)["param"] == "logprobs"


def test_models_route_by_name_beside_the_local_model(fake: FakeUpstream) -> None:
    with stack(fake, local=True) as url:
        ids = [m["id"] for m in httpx.get(f"{url}/v1/models").json()["data"]]
        assert ids == ["reference", "fake"]
        assert gen(url, model="reference").json()["model"]["name"] == "reference"
        assert gen(url).json()["model"]["name"] == "fake"
        r = gen(url, model="nope")
        assert r.status_code == 404 and "fake@upstream" in error(r)["message"]
        assert fake.completions() == ["ok"]


def test_two_urls_are_balanced_by_outstanding_requests_and_get_the_key(fake: FakeUpstream) -> None:
    other = FakeUpstream()
    with stack(fake, script=("slow_first",), also=other, api_key="sk-upstream") as url:
        body = {"model": "fake", "prompt": "Hello", "max_tokens": 2, "stream": True}
        with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=60) as held:
            assert held.status_code == 200
            _eventually(lambda: fake.completions() == ["slow_first"])  # the first URL: both were idle
            assert gen(url).status_code == 200  # the first one is busy: the other URL takes it
        assert other.completions() == ["ok"] and fake.completions() == ["slow_first"]
        assert fake.auth == other.auth == ["Bearer sk-upstream"]


def _events(lines: Iterator[str]) -> list[tuple[str, str]]:
    out, kind = [], ""
    for line in lines:
        if line.startswith("event:"):
            kind = line[6:].strip()
        elif line.startswith("data:"):
            out.append((kind, line[5:].strip()))
            kind = ""
    return out


def _eventually(cond: Callable[[], bool], timeout: float = 30.0) -> None:
    """Poll a condition another thread makes true (bounded, so a failure cannot hang the suite)."""
    end = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < end, "condition never became true"
        time.sleep(0.01)


def test_tool_choice_auto_is_refused_by_name_through_an_upstream(fake: FakeUpstream) -> None:
    """`auto`'s grammar is no JSON schema an upstream engine could be sent: refused up front, by name."""
    tools = [{"type": "function", "function": {"name": "clock", "parameters": {"type": "object"}}}]
    with stack(fake) as url:
        for choice in ({}, {"tool_choice": "auto"}):
            body = {"model": "fake", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 8,
                    "tools": tools, **choice}
            r = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=60)
            assert r.status_code == 400 and r.json()["error"]["code"] == "unsupported_for_model", r.text
            assert r.json()["error"]["param"] == "tool_choice"
