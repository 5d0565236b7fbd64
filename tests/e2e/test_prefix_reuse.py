"""Token-granular prefix reuse on the real model: what docs/engine.md relies on, checked where it could break.

A prompt token's KV must not depend on where its prompt was cut into chunks of two or more tokens, so a
prefix copied from another slot, cut at any token, continues exactly as a cold prefill would. Checked bit
for bit on the logits at odd boundaries (1, 2, 3, 17, 63, 64, 65, 130, 257 shared tokens), then on whole
greedy and seeded generations through the engine, solo and batched, against a cold cache.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator

import numpy as np
import pytest

from sluicegate.backends.base import BatchItem
from sluicegate.backends.llama_cpp import LlamaCppRunner, default_model_path
from sluicegate.engine import Engine, EngineRequest, RequestOutput, SamplingParams, SchedulerConfig

BOUNDARIES = [1, 2, 3, 17, 63, 64, 65, 130, 257]
TEXT = (
    "The lighthouse keeper counted the ships every evening and wrote their names in a blue notebook. "
    "One winter night a ship without a name passed the rocks, and the keeper followed its lights "
    "until they vanished behind the northern cape. In the morning the harbour master asked about it. "
) * 6


@pytest.fixture(scope="module")
def runner() -> Iterator[LlamaCppRunner]:
    r = LlamaCppRunner(default_model_path(), n_ctx=512, n_slots=4)
    yield r
    r.close()


def base_ids(r: LlamaCppRunner) -> list[int]:
    ids = r.tokenize(TEXT)
    assert len(ids) > max(BOUNDARIES) + 2
    return ids


def probe(r: LlamaCppRunner, base: list[int], k: int) -> list[int]:
    return [*base[:k], *r.tokenize(f" Question {k}: what did the keeper write?", add_special=False)]


@pytest.mark.timeout(1200)  # seconds on a quiet 2-core machine; minutes under contention
def test_a_prefix_reused_at_any_token_gives_bit_identical_logits(runner: LlamaCppRunner) -> None:
    base = base_ids(runner)
    runner.clear(0)
    for a, b in ((0, 37), (37, 100), (100, 163), (163, len(base))):  # uneven chunks, as a step budget cuts
        runner.execute([BatchItem(0, base[a:b], a, False)])
    neighbour = runner.tokenize("A neighbour decoding beside it")
    runner.clear(3)
    runner.execute([BatchItem(3, neighbour, 0, False)])
    pos = len(neighbour)
    for k in BOUNDARIES:
        p = probe(runner, base, k)
        runner.clear(2)
        cold = runner.execute([BatchItem(2, p, 0, True)])[0].copy()
        runner.copy(0, 1)
        runner.truncate(1, k)
        reused = runner.execute([BatchItem(1, p[k:], k, True)])[0].copy()
        assert np.array_equal(reused, cold), f"{k} shared tokens: max |diff| {np.abs(reused - cold).max()}"
        # the same in company: another slot's decode token in the same step
        runner.copy(0, 1)
        runner.truncate(1, k)
        both = runner.execute([BatchItem(3, [neighbour[-1]], pos, True), BatchItem(1, p[k:], k, True)])
        pos += 1
        assert np.array_equal(both[1], cold), f"{k} shared tokens, batched"


class Sink:
    def __init__(self) -> None:
        self.ids: list[int] = []
        self.final: RequestOutput | None = None
        self.done = threading.Event()

    def __call__(self, out: RequestOutput) -> None:
        self.ids += out.new_token_ids
        if out.finished:
            self.final = out
            self.done.set()


def generate(eng: Engine, prompts: list[list[int]], *, together: bool) -> list[Sink]:
    sinks = []
    for i, p in enumerate(prompts):
        params = SamplingParams(max_new_tokens=16, temperature=0.0 if i % 2 else 0.9, seed=i, ignore_eos=True)
        s = Sink()
        eng.submit(EngineRequest(f"p{i}-{len(p)}", p, params), s)
        sinks.append(s)
        if not together:
            assert s.done.wait(600)
    for s in sinks:
        assert s.done.wait(600) and s.final is not None and s.final.error is None
    return sinks


def engine(cfg: SchedulerConfig, slots: int) -> Engine:
    eng = Engine(LlamaCppRunner(default_model_path(), n_ctx=512, n_slots=slots), cfg)
    eng.start()
    return eng


@pytest.mark.timeout(1200)  # about a minute on a quiet 2-core machine; minutes under contention
def test_engine_outputs_with_reuse_equal_a_cold_cache_solo_and_batched(runner: LlamaCppRunner) -> None:
    base = base_ids(runner)
    probes = [probe(runner, base, k) for k in BOUNDARIES]
    cold_eng = engine(SchedulerConfig(block_size=1 << 20), 1)  # nothing is ever reused
    try:
        cold = generate(cold_eng, probes, together=False)
    finally:
        cold_eng.stop()
        cold_eng.close()
    assert all(s.final is not None and s.final.cached_tokens == 0 for s in cold)
    # a small step budget prefills the base in uneven chunks beside other work
    for together in (False, True):
        eng = engine(SchedulerConfig(max_batch_tokens=71), 12)  # a slot per probe: the base stays cached
        try:
            generate(eng, [base], together=False)
            got = generate(eng, probes, together=together)
            assert eng.stats.prefix_hits >= len(probes)
        finally:
            eng.stop()
            eng.close()
        for k, s, c in zip(BOUNDARIES, got, cold, strict=True):
            assert s.final is not None and s.final.cached_tokens == k, (together, k)
            assert s.ids == c.ids, f"{k} shared tokens ({'batched' if together else 'solo'})"
