"""The llama.cpp runner's batch filling and logits rows: every item gets its own row, whatever the order.

The runner fills its batch with numpy slices and, for a decode step whose items come in slot order, returns
a view of llama.cpp's logits buffer instead of a copy. Each row must still be the logits a solo call gives
(batch invariance makes them bit-identical), for items in any order and for mixed steps.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest

from sluicegate.backends.base import BatchItem, Logits
from sluicegate.backends.llama_cpp import LlamaCppRunner, default_model_path

PROMPTS = ["The capital of France is", "def add(a, b):", "Once upon a time there was", "2 + 2 ="]


@pytest.fixture(scope="module")
def runner() -> Iterator[LlamaCppRunner]:
    r = LlamaCppRunner(default_model_path(), n_ctx=128, n_slots=4)
    yield r
    r.close()


def prefill_each(r: LlamaCppRunner, ids: list[list[int]]) -> list[Logits]:
    rows = []
    for slot, p in enumerate(ids):
        r.clear(slot)
        rows.append(r.execute([BatchItem(slot, p, 0, True)])[0].copy())
    return rows


@pytest.mark.timeout(1200)  # seconds on a quiet 2-core machine; minutes under contention
def test_rows_follow_the_items_whatever_their_order(runner: LlamaCppRunner) -> None:
    ids = [runner.tokenize(p) for p in PROMPTS]
    solo_prefill = prefill_each(runner, ids)
    nxt = [int(np.argmax(x)) for x in solo_prefill]
    solo_decode = [runner.execute([BatchItem(s, [nxt[s]], len(ids[s]), True)])[0].copy() for s in range(4)]

    for order in ([2, 0, 3, 1], [0, 1, 2, 3]):  # prompt chunks together, in any order
        for s in range(4):
            runner.clear(s)
        out = runner.execute([BatchItem(s, ids[s], 0, True) for s in order])
        assert all(np.array_equal(out[i], solo_prefill[s]) for i, s in enumerate(order))

    decode = runner.execute([BatchItem(s, [nxt[s]], len(ids[s]), True) for s in range(4)])
    assert decode.base is not None  # slot order: llama.cpp's own buffer, not a copy
    assert all(np.array_equal(decode[s], solo_decode[s]) for s in range(4))

    prefill_each(runner, ids)
    order = [3, 1, 0, 2]
    shuffled = runner.execute([BatchItem(s, [nxt[s]], len(ids[s]), True) for s in order])
    assert all(np.array_equal(shuffled[i], solo_decode[s]) for i, s in enumerate(order))

    # a mixed step: two decode tokens, one prompt chunk wanting logits, one not
    prefill_each(runner, ids)
    for s in (2, 3):
        runner.clear(s)
    mixed = runner.execute([
        BatchItem(3, ids[3], 0, False), BatchItem(1, [nxt[1]], len(ids[1]), True),
        BatchItem(2, ids[2], 0, True), BatchItem(0, [nxt[0]], len(ids[0]), True),
    ])
    assert mixed.shape[0] == 3
    assert np.array_equal(mixed[0], solo_decode[1]) and np.array_equal(mixed[1], solo_prefill[2])
    assert np.array_equal(mixed[2], solo_decode[0])
