"""Greedy decoding through a runner beside other sequences: the determinism test and benchmark share it."""

from __future__ import annotations

import itertools

import numpy as np

from sluicegate.backends.base import BatchItem, ModelRunner

FILLER = 7  # the token every neighbour decodes: what it is does not matter, only that it shares the step


def greedy_in_company(runner: ModelRunner, tok: int, pos: int, neighbours: dict[int, int],
                      steps: int) -> list[np.ndarray]:
    """Decode sequence 0 greedily for `steps` steps, from token `tok` at position `pos`, each step beside one
    token of every neighbour (slot -> its next position); returns sequence 0's logits row of each step."""
    at = dict(neighbours)
    rows = []
    for _ in range(steps):
        items = [BatchItem(0, [tok], pos, True)] + [BatchItem(s, [FILLER], at[s], True) for s in at]
        out = runner.execute(items)
        rows.append(np.array(out[0], copy=True))
        tok, pos = int(np.argmax(out[0])), pos + 1
        for s in at:
            at[s] += 1
    return rows


def prefill_cut(runner: ModelRunner, slot: int, ids: list[int], bounds: list[int]) -> np.ndarray:
    """Clear `slot` and prefill `ids` cut at `bounds` (a piece over the runner's n_batch is cut again); returns
    the last piece's logits row (a copy)."""
    runner.clear(slot)
    out = np.empty(0, np.float32)
    step = runner.limits.n_batch
    for a, b in itertools.pairwise(bounds):
        for lo in range(a, b, step):
            hi = min(b, lo + step)
            out = np.array(runner.execute([BatchItem(slot, ids[lo:hi], lo, True, prompt=True)])[0], copy=True)
    return out
