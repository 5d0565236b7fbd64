"""Engine metrics, kept for /metrics: counters and recent-latency windows."""

from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import dataclass, field


def _window() -> deque[float]:
    return deque(maxlen=1024)


@dataclass(slots=True)
class EngineStats:
    steps: int = 0
    prompt_tokens: int = 0  # prompt tokens computed (cache hits excluded)
    cached_tokens: int = 0  # prompt tokens reused from the prefix cache
    generated_tokens: int = 0
    requests_finished: int = 0
    requests_cancelled: int = 0
    requests_failed: int = 0
    requests_refused: int = 0
    running: int = 0
    waiting: int = 0
    slots_busy: int = 0
    slots_total: int = 0
    queue_s: deque[float] = field(default_factory=_window)
    ttft_s: deque[float] = field(default_factory=_window)
    itl_s: deque[float] = field(default_factory=_window)
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
                for k in (
                    "steps", "prompt_tokens", "cached_tokens", "generated_tokens", "requests_finished",
                    "requests_cancelled", "requests_failed", "requests_refused", "running", "waiting",
                    "slots_busy", "slots_total",
                )
            }
            for name in ("queue_s", "ttft_s", "itl_s"):
                vals = sorted(getattr(self, name))
                out[f"{name}_p50"] = vals[len(vals) // 2] if vals else 0.0
                out[f"{name}_p95"] = vals[min(len(vals) - 1, int(len(vals) * 0.95))] if vals else 0.0
        return out
