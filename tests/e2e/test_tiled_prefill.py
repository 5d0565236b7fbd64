"""`--tiled-prefill` on the real model, through the runner, bit for bit (backends/tiled.py).

Prompt tokens on the tiled kernel whatever the cut (short and one-token pieces padded), generated tokens on
the one-row path whatever the company (a lone decode token past the split-KV threshold twinned in a
neighbouring slot, or computed on one thread where there is none), and the junk rows leave nothing behind.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest

from sluicegate.backends.base import BatchItem
from sluicegate.backends.llama_cpp import LlamaCppRunner, default_model_path
from sluicegate.testing.decoding import greedy_in_company, prefill_cut

RNG = np.random.default_rng(3)
PROMPT = [int(t) for t in RNG.integers(100, 40_000, size=700)]
OTHER = [int(t) for t in RNG.integers(100, 40_000, size=900)]


@pytest.fixture(scope="module")
def runner() -> Iterator[LlamaCppRunner]:
    r = LlamaCppRunner(default_model_path(), n_ctx=1024, n_slots=4, n_threads=2, tiled_prefill=True)
    yield r
    r.close()


prefill = prefill_cut


def end_of(r: LlamaCppRunner, slot: int) -> int:
    return r._end_of(slot)


def test_the_runner_reports_its_numerics(runner: LlamaCppRunner) -> None:
    lim = runner.limits
    assert lim.batch_invariant and lim.drafts_exact and not lim.decoded_kv_exact and lim.max_drafts == 62
    assert lim.numerics == "flash-attn:k=f16:v=f16:tiled-prefill"


def test_any_cut_of_a_prompt_gives_the_same_logits_and_leaves_no_junk(runner: LlamaCppRunner) -> None:
    whole = prefill(runner, 0, PROMPT, [0, 512, 700])
    for bounds in ([0, 1, 2, 66, 400, 699, 700], [0, 30, 64, 100, 600, 700], [*range(0, 700, 50), 700]):
        assert np.array_equal(prefill(runner, 1, PROMPT, bounds), whole), bounds
        assert end_of(runner, 1) == 700  # the padding's KV is gone


def test_a_prefix_reused_at_any_length_continues_exactly(runner: LlamaCppRunner) -> None:
    prefill(runner, 1, PROMPT, [0, 512, 700])
    for k in (1, 17, 63, 64, 65, 300):
        cold = prefill(runner, 0, PROMPT[: k + 9], [0, k + 9])
        runner.copy(1, 2)
        runner.truncate(2, k)
        got = runner.execute([BatchItem(2, PROMPT[k : k + 9], k, True, prompt=True)])[0]
        assert np.array_equal(cold, got), k


@pytest.mark.parametrize("at", [100, 300, 650])
def test_decoding_alone_equals_decoding_in_company(runner: LlamaCppRunner, at: int) -> None:
    def run(neighbours: dict[int, int]) -> list[np.ndarray]:
        prefill(runner, 0, PROMPT[:at], [0, at])
        for slot, n in neighbours.items():
            prefill(runner, slot, OTHER[:n], [0, n])
        return greedy_in_company(runner, PROMPT[at], at, neighbours, 4)

    alone = run({})
    for crowd in ({1: 40}, {3: 800}, {2: 300}, {1: 50, 2: 700, 3: 200}):
        got = run(crowd)
        assert all(np.array_equal(a, b) for a, b in zip(alone, got, strict=True)), crowd
    assert [end_of(runner, s) for s in (1, 2, 3)] == [54, 704, 204]  # 4 steps each; the twins' KV is gone


def test_a_single_slot_decodes_on_one_thread_with_the_same_numerics(runner: LlamaCppRunner) -> None:
    solo = LlamaCppRunner(default_model_path(), n_ctx=1024, n_slots=1, n_threads=2, tiled_prefill=True,
                          adaptive_threads=False)
    try:
        prefill(solo, 0, PROMPT[:600], [0, 600])
        got = greedy_in_company(solo, PROMPT[600], 600, {}, 3)
        assert solo.compute_threads == 2  # the fallback's one thread was for that call only
    finally:
        solo.close()
    prefill(runner, 0, PROMPT[:600], [0, 600])
    prefill(runner, 1, OTHER[:100], [0, 100])
    want = greedy_in_company(runner, PROMPT[600], 600, {1: 100}, 3)
    assert all(np.array_equal(a, b) for a, b in zip(got, want, strict=True))
