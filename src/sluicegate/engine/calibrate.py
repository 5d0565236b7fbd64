"""The step model's measurement (engine/forecast.py `Calibration`), taken while the model loads
(`Engine.calibrate`, before `/readyz` says ready)."""

from __future__ import annotations

import time

from sluicegate.backends.base import BatchItem, ModelRunner
from sluicegate.engine.forecast import Calibration

SHORT, CHUNK = 4, 32  # a minimal prompt, and the prompt tokens whose cost is timed
POSITION = 64  # where the timed decode steps are: a short chat prompt and some of its answer (attention grows with it)


def batch_sizes(n: int) -> list[int]:
    """The batch sizes timed: 1, the powers of two below `n`, and `n` (forecast.py `Calibration.step`)."""
    sizes, b = [1], 2
    while b < n:
        sizes.append(b)
        b *= 2
    return [*sizes, n] if n > 1 else sizes


def measure(r: ModelRunner, repeats: int = 6) -> Calibration:
    """What prompt tokens add to a step (a `CHUNK`-token prompt against a `SHORT`-token one), then decode steps
    of each of `batch_sizes` sequences at `POSITION` (the median of `repeats`, after one not counted). One
    prompt is computed and copied to every slot. The caller owns the runner while it runs; it leaves every slot
    empty. About 2 s on a 2-core CPU (SmolLM2-135M, 16 slots)."""
    n = r.limits.n_slots
    vocab = max(2, r.limits.n_vocab)
    ids = [(100 + i) % vocab for i in range(max(CHUNK + SHORT, POSITION))]

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

    def decode(b: int) -> float:
        times = [timed([BatchItem(s, [ids[k]], POSITION + k) for s in range(b)]) for k in range(repeats + 1)]
        for s in range(b):
            r.truncate(s, POSITION)
        return sorted(times[1:])[repeats // 2]

    try:
        prefill(SHORT)  # warm-up: first-call costs are not a step's
        token_s = max(0.0, prefill(SHORT + CHUNK) - prefill(SHORT)) / CHUNK
        r.clear(0)
        r.execute([BatchItem(0, ids[:POSITION], 0, prompt=True)])
        for s in range(1, n):
            r.copy(0, s)
        steps = {b: decode(b) for b in batch_sizes(n)}
    finally:
        for s in range(n):
            r.clear(s)
    step_1 = steps.pop(1)
    step_n = steps.pop(n, step_1)
    return Calibration(n, step_1, max(step_1, step_n), token_s, tuple(sorted(steps.items())))
