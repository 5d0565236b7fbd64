"""Upstream endpoints: one circuit breaker per URL, and the choice among a model's URLs.

A breaker is the classic three states, hand-written because it is twenty lines and must share the
endpoint's outstanding count: closed (requests flow; `breaker_failures` consecutive failures open it), open
(every request is refused at once with 503 `upstream_unavailable` and Retry-After the time left open), then
half-open after `breaker_open_s` (one trial request; success closes, failure opens again). Only failures of
the upstream count (connect errors, timeouts, 5xx, a broken stream), never a 4xx our request earned.

Among a model's URLs the one with the fewest outstanding requests is chosen (ties: the first listed), so a
slow engine gets less work, as vLLM's router and llama-server's load balancers do.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass

from sluicegate import redaction


@dataclass(slots=True)
class Endpoint:
    url: str  # base URL, `/v1` included, no trailing slash
    failures_to_open: int = 5
    open_s: float = 10.0
    outstanding: int = 0
    failures: int = 0
    open_until: float = 0.0  # monotonic; while in the future the circuit is open
    trial: bool = False  # half-open: one request is trying it

    @property
    def shown(self) -> str:
        """The URL as logs and messages show it: any user information masked (sluicegate/redaction.py)."""
        return redaction.url(self.url)

    @property
    def root(self) -> str:
        """The server root (where vLLM and llama-server put `/tokenize`)."""
        return self.url.removesuffix("/v1")

    def available(self, now: float) -> bool:
        if self.open_until == 0.0:
            return True
        return now >= self.open_until and not self.trial

    def acquire(self, now: float) -> None:
        self.outstanding += 1
        if self.open_until and now >= self.open_until:
            self.trial = True

    def release(self, ok: bool | None) -> None:
        """`ok` None: the attempt ended without telling whether the upstream is healthy (cancelled, 4xx)."""
        self.outstanding -= 1
        if ok is None:
            if self.trial:
                self.trial = False
            return
        if ok:
            self.failures, self.open_until, self.trial = 0, 0.0, False
            return
        self.failures += 1
        if self.trial or self.failures >= self.failures_to_open:
            self.open_until = time.monotonic() + self.open_s
            self.trial = False

    def retry_after(self, now: float) -> int:
        return max(1, math.ceil(self.open_until - now))


def pick(endpoints: Sequence[Endpoint], exclude: Endpoint | None = None) -> Endpoint | None:
    """The available endpoint with the fewest outstanding requests; `exclude` (the one that just failed)
    only if it is the only one left. None when every circuit is open."""
    now = time.monotonic()
    ready = [e for e in endpoints if e.available(now)]
    if exclude is not None and len(ready) > 1:
        ready = [e for e in ready if e is not exclude]
    return min(ready, key=lambda e: e.outstanding) if ready else None


def soonest_retry(endpoints: Sequence[Endpoint]) -> int:
    now = time.monotonic()
    return min(e.retry_after(now) for e in endpoints)
