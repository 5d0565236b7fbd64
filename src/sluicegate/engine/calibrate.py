"""The step model's measurement (engine/forecast.py `Calibration`), taken while the model loads
(`Engine.calibrate`, before `/readyz` says ready)."""

from __future__ import annotations

import time

from sluicegate.backends.base import BatchItem, ModelRunner
from sluicegate.engine.forecast import Calibration

SHORT, CHUNK = 4, 32  # a minimal prompt, and the prompt tokens whose cost is timed


def measure(r: ModelRunner, repeats: int = 6) -> Calibration:
    """What prompt tokens add to a step (a `CHUNK`-token prompt against a `SHORT`-token one), then decode steps
    of one sequence and of every slot (the median of `repeats`, after one not counted). The caller owns the
    runner while it runs; it leaves every slot empty. About 3 s on a 2-core CPU (SmolLM2-135M)."""
    n = r.limits.n_slots
    vocab = max(2, r.limits.n_vocab)
    ids = [(100 + i) % vocab for i in range(CHUNK + SHORT)]

    def timed(items: list[BatchItem]) -> float:
        began = time.perf_counter()
        r.execute(items)
        return time.perf_counter() - began

    def prefill(n_tokens: int) -> float:
        times = []
        for _ in range(3):
            r.clear(0)
            times.append(timed([BatchItem(0, ids[:n_tokens], 0, prompt=True)]))
        return sorted(times)[1]

    def decode(slots: range) -> float:
        per_call = max(1, r.limits.n_batch // SHORT)
        for first in range(0, len(slots), per_call):
            for s in slots[first:first + per_call]:
                r.clear(s)
            r.execute([BatchItem(s, ids[:SHORT], 0, prompt=True) for s in slots[first:first + per_call]])
        times = [timed([BatchItem(s, [ids[k]], SHORT + k) for s in slots]) for k in range(repeats + 1)]
        return sorted(times[1:])[repeats // 2]

    try:
        prefill(SHORT)  # warm-up: first-call costs are not a step's
        token_s = max(0.0, prefill(SHORT + CHUNK) - prefill(SHORT)) / CHUNK
        step_1 = decode(range(1))
        step_n = decode(range(n)) if n > 1 else step_1
    finally:
        for s in range(n):
            r.clear(s)
    return Calibration(n, step_1, max(step_1, step_n), token_s)
