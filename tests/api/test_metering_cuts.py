"""What a run cut short is charged, over a real socket, on SQLite and Postgres keys, with in-process buckets and
with the machine's Redis: a client that leaves while its prompt is being prefilled pays the prompt tokens the
engine prefilled (the usage ledger and the token bucket alike), never 0."""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Sequence
from typing import Any

import httpx

from sluicegate.backends.base import BatchItem, Logits
from sluicegate.config import Config, RateLimitConfig
from sluicegate.tenancy.keys import Scope, create_key
from sluicegate.testing.wait import wait_for
from tests.api.auth_helpers import auth, served
from tests.api.test_ratelimit_api import limits  # noqa: F401 (the fixture: in-process and Redis)
from tests.api.threaded_server import SlowRunner

BURST = 5000


class GatedRunner(SlowRunner):
    """Once armed, the first step that prefills (an item of several tokens) records its tokens, says so, and
    waits to be released: the test acts while the engine is inside that prefill."""

    def __init__(self, **kw: int) -> None:
        super().__init__(n_ctx=2048, n_slots=4, **kw)
        self.armed = False
        self.entered = threading.Event()
        self.release = threading.Event()
        self.prefill_tokens = 0

    def execute(self, batch: Sequence[BatchItem]) -> Logits:
        if self.armed and not self.entered.is_set() and any(len(b.token_ids) > 1 for b in batch):
            self.prefill_tokens = sum(len(b.token_ids) for b in batch)
            self.entered.set()
            self.release.wait(120)
        return super().execute(batch)


def post_and_leave(port: int, secret: str, body: dict[str, Any], runner: GatedRunner) -> None:
    """Send the request on a raw socket and close it once the engine is prefilling it."""
    raw = json.dumps(body).encode()
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                     b"Authorization: Bearer " + secret.encode() + b"\r\n"
                     b"Content-Length: " + str(len(raw)).encode() + b"\r\n\r\n" + raw)
        assert runner.entered.wait(120), "the engine never prefilled the request"


def test_a_client_that_leaves_during_prefill_pays_the_prefill(db_url: str, limits: RateLimitConfig) -> None:  # noqa: F811
    made: list[GatedRunner] = []

    def runner() -> GatedRunner:
        made.append(GatedRunner())
        return made[-1]

    with served(db_url, Config(ratelimit=limits), runner=runner) as s:
        _, secret = create_key(s.admin, "limited", {Scope.GENERATE}, tpm=1, burst=BURST)  # tpm 1: no refill
        gated = made[-1]
        gated.armed = True
        before = {"prompt_tokens": 0, "cached_tokens": 0, "generated_tokens": 0}
        spent = 0
        for n, stream in enumerate((True, False), 1):
            gated.entered.clear()
            gated.release.clear()
            body = {"model": "reference", "messages": [{"role": "user", "content": "xy"[n - 1] * 900}],
                    "max_tokens": 50, "stream": stream}
            post_and_leave(int(s.url.rsplit(":", 1)[1]), secret, body, gated)

            def counted() -> list[dict[str, Any]]:
                r = httpx.get(s.url + "/v1/usage", headers=auth(secret), timeout=30)
                return r.json()["data"]  # type: ignore[no-any-return]

            try:
                wait_for(lambda: bool(counted()) and counted()[0]["requests"] == n)  # noqa: B023
            finally:
                gated.release.set()
            (day,) = counted()
            prompt = day["prompt_tokens"] - before["prompt_tokens"]
            cached = day["cached_tokens"] - before["cached_tokens"]
            assert 0 < gated.prefill_tokens < 900  # cut inside the prompt
            # what the engine prefilled, plus what it reused from the prefix cache (counted as a finished run's is)
            assert prompt == gated.prefill_tokens + cached and day["generated_tokens"] == 0
            spent += prompt
            left = int(httpx.get(s.url + "/v1/models", headers=auth(secret)).headers["x-ratelimit-remaining-tokens"])
            assert BURST - spent <= left <= BURST - spent + 1  # the bucket paid it too (+ a second's refill)
            before = day
