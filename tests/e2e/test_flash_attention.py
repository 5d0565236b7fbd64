"""Flash attention as the runner ships it (K cache in bf16, so ggml's kernel takes its one-row path for every
call; backends/llama_cpp.py): a token's logits depend on nothing but its sequence, bit for bit, where
llama.cpp's default f16 cache would round differently: a lone sequence decoding past 256 positions (split-KV)
against the same in company, decoded tokens against the same tokens prefilled in one 270-token call (tiled),
and so a conversation's next turn can reuse the replies before it.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest

from sluicegate.backends.base import BatchItem
from sluicegate.backends.llama_cpp import LlamaCppRunner, default_model_path
from sluicegate.engine import Engine, EngineRequest, SamplingParams, SchedulerConfig
from sluicegate.testing.decoding import greedy_in_company
from tests.e2e.test_prefix_reuse import Sink

TEXT = (
    "The lighthouse keeper counted the ships every evening and wrote their names in a blue notebook. "
    "One winter night a ship without a name passed the rocks, and the keeper followed its lights. "
) * 7


@pytest.fixture(scope="module")
def runner() -> Iterator[LlamaCppRunner]:
    # two threads whatever the load: the split-KV path splits the cells across threads, and on one thread it
    # computes as the one-row path does, so a regression to it could not show
    r = LlamaCppRunner(default_model_path(), n_ctx=512, n_slots=4, n_threads=2, adaptive_threads=False)
    assert r.limits.decoded_kv_exact and r.limits.batch_invariant and r.limits.numerics == "flash-attn:k=bf16:v=f16"
    yield r
    r.close()


def decode(r: LlamaCppRunner, prompt: list[int], steps: int, neighbours: tuple[int, ...]) -> list[np.ndarray]:
    """Greedy decode steps of slot 0 from `prompt` (all but its last token prefilled in one call), each step
    beside one decode token of every slot in `neighbours` (which hold a short text); every step's logits."""
    r.clear(0)
    r.execute([BatchItem(0, prompt[:-1], 0, False)])
    other = r.tokenize("A neighbour decoding beside it")
    pos = {}
    for s in neighbours:
        r.clear(s)
        r.execute([BatchItem(s, other, 0, False)])
        pos[s] = len(other)
    return greedy_in_company(r, prompt[-1], len(prompt) - 1, pos, steps)


@pytest.mark.timeout(1200)  # well under a minute on a quiet 2-core machine; minutes under contention
def test_decoding_past_256_positions_alone_or_in_company_and_as_a_prompt_agree(runner: LlamaCppRunner) -> None:
    prompt = runner.tokenize(TEXT)
    assert 240 < len(prompt) < 256  # the steps below cross position 256, where split-KV would start
    alone = decode(runner, prompt, 24, ())
    for crowd in ((1,), (3,), (1, 2, 3)):  # a consecutive run; a slot apart (both alone); all together
        got = decode(runner, prompt, 24, crowd)
        for i, (a, b) in enumerate(zip(alone, got, strict=True)):
            assert np.array_equal(a, b), f"step {i} beside {crowd}: max |diff| {np.abs(a - b).max()}"
    # the decoded tokens prefilled as one prompt (one call of 270 rows): the same last logits
    seq = [*prompt, *(int(np.argmax(row)) for row in alone[:-1])]
    runner.clear(2)
    again = runner.execute([BatchItem(2, seq, 0, True)])[0]
    assert np.array_equal(again, alone[-1]), f"max |diff| {np.abs(again - alone[-1]).max()}"


def conversation(eng: Engine, r: LlamaCppRunner, seed: int | None) -> tuple[list[list[int]], list[int]]:
    """Three turns through the engine, each resending the history with the replies given."""
    history = r.tokenize("<|im_start|>system\nYou are a keeper of lighthouses.<|im_end|>\n", parse_special=True)
    turns, cached = [], []
    for user in ("Name a ship.", "Why that name?", "And the next one?"):
        prompt = [*history, *r.tokenize(f"<|im_start|>user\n{user}<|im_end|>\n<|im_start|>assistant\n",
                                        add_special=False, parse_special=True)]
        sink = Sink()
        params = SamplingParams(max_new_tokens=40, temperature=0.0 if seed is None else 0.8, seed=seed or 0,
                                ignore_eos=True)
        eng.submit(EngineRequest(f"turn{len(turns)}-{seed}", prompt, params), sink)
        assert sink.done.wait(600) and sink.final is not None and sink.final.error is None
        cached.append(sink.final.cached_tokens)
        turns.append(sink.ids)
        history = [*prompt, *sink.ids]
    return turns, cached


@pytest.mark.timeout(1200)
def test_a_conversation_reuses_its_replies_and_answers_as_a_cold_cache_does(runner: LlamaCppRunner) -> None:
    def run(cfg: SchedulerConfig) -> list[tuple[list[list[int]], list[int]]]:
        eng = Engine(LlamaCppRunner(default_model_path(), n_ctx=512, n_slots=2), cfg)
        eng.start()
        try:
            return [conversation(eng, runner, seed) for seed in (None, 5)]
        finally:
            eng.stop()
            eng.close()

    cold = run(SchedulerConfig(block_size=1 << 20))
    warm = run(SchedulerConfig())
    for (cold_turns, cold_cached), (turns, cached) in zip(cold, warm, strict=True):
        assert turns == cold_turns
        assert cold_cached == [0, 0, 0]
        # each turn reuses the whole previous prompt and its reply but the reply's last token (never computed)
        assert cached[1] > 40 and cached[2] > cached[1] + 40
