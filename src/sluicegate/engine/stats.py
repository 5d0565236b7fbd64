"""Engine metrics, kept for /metrics: counters and recent-latency windows."""

from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import dataclass, field

COUNTERS = (
    "steps", "prompt_tokens", "cached_tokens", "generated_tokens", "requests_finished", "requests_cancelled",
    "requests_expired", "requests_failed", "requests_refused", "prefix_lookups", "prefix_hits",
    "prefix_evicted_blocks",
)
GAUGES = (
    "running", "waiting", "slots_busy", "slots_total", "kv_tokens_used", "kv_tokens_total",
    "prefix_cached_blocks",
)


def _window() -> deque[float]:
    return deque(maxlen=1024)


@dataclass(slots=True)
class EngineStats:
    """Written by the engine thread under `lock`; read by anyone through `snapshot()`."""

    # counters
    steps: int = 0  # forward passes
    prompt_tokens: int = 0  # prompt tokens computed (cache hits excluded)
    cached_tokens: int = 0  # prompt tokens reused from the prefix cache
    generated_tokens: int = 0
    requests_finished: int = 0  # every way out, cancelled and failed included
    requests_cancelled: int = 0  # client left, explicit abort, deadline, shutdown
    requests_expired: int = 0  # of the cancelled: by their deadline
    requests_failed: int = 0
    requests_refused: int = 0  # 503 overloaded: the waiting queue was full
    prefix_lookups: int = 0  # requests that took a slot
    prefix_hits: int = 0  # of those, requests that reused at least one cached block
    prefix_evicted_blocks: int = 0  # cached blocks dropped to make room
    # gauges
    running: int = 0
    waiting: int = 0
    slots_busy: int = 0
    slots_total: int = 0
    kv_tokens_used: int = 0  # KV positions held by running sequences
    kv_tokens_total: int = 0  # slots x window
    prefix_cached_blocks: int = 0  # blocks held by free slots, ready for reuse
    # recent windows (seconds)
    queue_s: deque[float] = field(default_factory=_window)  # arrival -> first scheduled
    ttft_s: deque[float] = field(default_factory=_window)  # arrival -> first token
    itl_s: deque[float] = field(default_factory=_window)  # between a stream's consecutive tokens
    step_s: deque[float] = field(default_factory=_window)  # one forward pass, sampling included
    finish_times: deque[float] = field(default_factory=_window)
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
            out: dict[str, float] = {
                k: float(getattr(self, k))
                for k in COUNTERS + GAUGES
            }
            out["kv_usage"] = self.kv_tokens_used / self.kv_tokens_total if self.kv_tokens_total else 0.0
            for name in ("queue_s", "ttft_s", "itl_s", "step_s"):
                vals = sorted(getattr(self, name))
                out[f"{name}_p50"] = vals[len(vals) // 2] if vals else 0.0
                out[f"{name}_p95"] = vals[min(len(vals) - 1, int(len(vals) * 0.95))] if vals else 0.0
        return out
