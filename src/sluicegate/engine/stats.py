"""Engine counters and gauges, written by the engine thread under `lock`, exported by engine/metrics.py."""

from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import dataclass, field

# name -> help text; exported as `sluicegate_<name>_total` (counters) and `sluicegate_<name>` (gauges)
COUNTER_HELP = {
    "steps": "engine steps (forward passes)",
    "prompt_tokens": "prompt tokens computed (prefix-cache hits excluded)",
    "cached_tokens": "prompt tokens reused from the prefix cache",
    "generated_tokens": "tokens generated",
    "requests_refused": "requests refused by the engine because its waiting queue was full",
    "requests_expired": "requests ended by their deadline (queued or running)",
    "prefix_lookups": "requests that took a slot and looked up the prefix cache",
    "prefix_hits": "of those, requests that reused at least one cached prompt token",
    "prefix_evicted_tokens": "cached prompt tokens dropped (held by no slot any more) to make room",
}
GAUGE_HELP = {
    "running": "sequences holding a slot",
    "waiting": "requests waiting for a slot",
    "slots_busy": "slots in use",
    "slots_total": "slots the runner holds",
    "kv_tokens_used": "KV positions held by running sequences",
    "kv_tokens_total": "KV positions in all slots (slots x window)",
    "kv_usage": "kv_tokens_used / kv_tokens_total",
    "prefix_cached_tokens": "prompt tokens held by free slots, ready for reuse",
}
COUNTERS = (*COUNTER_HELP, "requests_finished", "requests_cancelled", "requests_failed")
GAUGES = tuple(g for g in GAUGE_HELP if g != "kv_usage")


@dataclass(slots=True)
class EngineStats:
    """Written by the engine thread under `lock`; read by anyone through `snapshot()`."""

    # counters
    steps: int = 0  # forward passes
    prompt_tokens: int = 0  # prompt tokens computed (cache hits excluded)
    cached_tokens: int = 0  # prompt tokens reused from the prefix cache
    generated_tokens: int = 0
    requests_finished: int = 0  # every way out, cancelled and failed included (exported by finish reason)
    requests_cancelled: int = 0  # client left, explicit abort, deadline, shutdown
    requests_expired: int = 0  # of the cancelled: by their deadline
    requests_failed: int = 0
    requests_refused: int = 0  # 503 overloaded: the waiting queue was full
    prefix_lookups: int = 0  # requests that took a slot
    prefix_hits: int = 0  # of those, requests that reused at least one cached prompt token
    prefix_evicted_tokens: int = 0  # cached prompt tokens dropped to make room
    # gauges
    running: int = 0
    waiting: int = 0
    slots_busy: int = 0
    slots_total: int = 0
    kv_tokens_used: int = 0  # KV positions held by running sequences
    kv_tokens_total: int = 0  # slots x window
    prefix_cached_tokens: int = 0  # prompt tokens held by free slots, ready for reuse
    finish_times: deque[float] = field(default_factory=lambda: deque(maxlen=1024))  # for the drain rate
    lock: threading.Lock = field(default_factory=threading.Lock)

    def drain_rate(self, now: float | None = None, horizon_s: float = 30.0) -> float:
        """Requests finished per second over the last `horizon_s` seconds (0.0 when unknown)."""
        now = time.monotonic() if now is None else now
        with self.lock:
            recent = [t for t in self.finish_times if now - t <= horizon_s]
        if len(recent) < 2:
            return 0.0
        span = max(now - recent[0], 1e-3)
        return len(recent) / span

    def snapshot(self) -> dict[str, float]:
        with self.lock:
            out: dict[str, float] = {k: float(getattr(self, k)) for k in COUNTERS + GAUGES}
        out["kv_usage"] = out["kv_tokens_used"] / out["kv_tokens_total"] if out["kv_tokens_total"] else 0.0
        return out
