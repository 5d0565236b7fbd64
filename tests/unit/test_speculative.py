"""Speculative decoding (prompt lookup) on the reference backend: exact, so outputs must equal plain decoding."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import numpy as np
import pytest

from sluicegate.backends.base import BatchItem, Logits
from sluicegate.backends.reference import EOS_ID, ReferenceRunner
from sluicegate.engine import AsyncEngine, Engine, FinishReason, SchedulerConfig
from sluicegate.engine.scheduler import Scheduler, Seq
from sluicegate.engine.speculative import accepted, propose
from sluicegate.serving.models import ServedModel
from sluicegate.serving.openai_common import fingerprint
from sluicegate.testing.wait import wait_for
from tests.unit.test_engine import Collector, Runner, engine, req, run

SPEC = SchedulerConfig(speculative_ngram=4)
REPEAT = "the cat sat on the mat. " * 6
PERIOD = 24


class CopyRunner(Runner):
    """A model that repeats its context with a period of 24 tokens (EOS from position `eos_at`): its greedy
    text is readable, so drafts are accepted and stop strings fall inside a step's accepted tokens."""

    eos_at = 10_000

    def execute(self, batch: Sequence[BatchItem]) -> Logits:
        super().execute(batch)
        rows = []
        for item in batch:
            held = self._slots[item.slot]
            end = item.start_pos + len(item.token_ids)
            for p in range(item.start_pos if item.logits_all else end - 1, end) if item.want_logits else ():
                row = np.zeros(self.limits.n_vocab, np.float32)
                row[EOS_ID if p + 1 >= self.eos_at else held[p + 1 - PERIOD]] = 1.0
                rows.append(row)
        return np.stack(rows) if rows else np.zeros((0, self.limits.n_vocab), np.float32)


def test_propose_takes_what_followed_the_latest_earlier_match_of_the_tail() -> None:
    ctx = [1, 2, 3, 9, 8, 1, 2, 3, 7, 6, 5, 1, 2, 3]
    assert propose(ctx, 2, 3) == [7, 6]  # the latest earlier [1, 2, 3] is followed by 7, 6 (not 9, 8)
    assert propose(ctx, 10, 3) == [7, 6, 5, 1, 2, 3]  # runs into the tail itself
    assert propose([5, 6, 7, 5, 6], 3, 3, 2) == [7, 5, 6]  # no 3-gram match: the 2-gram [5, 6] matches
    assert propose([5, 6, 7, 5, 6], 3, 3, 3) == []  # n_min 3: nothing
    assert propose([1, 1, 1], 4, 3) == [1]  # [1, 1] at 0 is followed by one token
    assert propose([4, 5, 6], 3, 3, 1) == [] and propose([4], 3, 1) == [] and propose(ctx, 0, 3) == []


def test_accepted_is_the_agreeing_prefix() -> None:
    assert accepted([1, 2, 3], [1, 2, 4, 9]) == 2
    assert accepted([1, 2, 3], [1, 2, 3, 9]) == 3
    assert accepted([1, 2, 3], [0, 2, 3, 9]) == 0


def test_logits_all_gives_every_positions_logits_as_one_at_a_time_would() -> None:
    ids = [256, *b"hello world"]
    a, b = ReferenceRunner(n_slots=1), ReferenceRunner(n_slots=1)
    a.execute([BatchItem(0, ids[:4], 0, False)])
    b.execute([BatchItem(0, ids[:4], 0, False)])
    rows = a.execute([BatchItem(0, ids[4:], 4, True, logits_all=True)])
    one = [b.execute([BatchItem(0, [t], 4 + i, True)])[0] for i, t in enumerate(ids[4:])]
    assert rows.shape == (len(ids) - 4, a.limits.n_vocab)
    np.testing.assert_array_equal(rows, np.stack(one))


def test_only_greedy_unconstrained_sequences_are_drafted() -> None:
    s = Scheduler(SPEC, 2, frozenset({257}))
    greedy, sampled = Seq(req(REPEAT, temperature=0.0, max_new_tokens=50), 0), Seq(req(REPEAT, max_new_tokens=50), 0)
    for seq in (greedy, sampled):
        seq.output_ids = list(REPEAT.encode()[:6])
    assert s._drafts(greedy, 100) == list(b"t sa")  # output "the ca": " ca" was followed by "t sa"
    assert s._drafts(sampled, 100) == []
    assert s._drafts(greedy, 2) == list(b"t ")  # bounded by the step's spare budget
    greedy.output_ids = greedy.output_ids + [0] * 42  # 48 of 50: room for one draft and the token after it
    greedy.output_ids[-3:] = list(b"the")
    assert len(s._drafts(greedy, 100)) == 1


def test_a_runners_max_drafts_bounds_every_verification_item() -> None:
    s = Scheduler(SchedulerConfig(speculative_ngram=8), 2, frozenset({257}), max_drafts=3)
    greedy = Seq(req(REPEAT, temperature=0.0, max_new_tokens=50), 0)
    greedy.output_ids = list(REPEAT.encode()[:6])
    assert s._drafts(greedy, 100) == list(b"t s")  # 8 asked, the runner takes 3
    assert Scheduler(SchedulerConfig(speculative_ngram=8), 2, frozenset({257}))._drafts(greedy, 100) == list(
        b"t sat on")


def _both(prompt: str, **params: object) -> tuple[Collector, Collector, dict[str, float]]:
    with engine() as (eng, _):
        off = run(eng, req(prompt, temperature=0.0, **params))
        off.wait()
    with engine(SPEC) as (eng, _):
        on = run(eng, req(prompt, temperature=0.0, **params))
        on.wait()
        stats = eng.stats.snapshot()
    return off, on, stats


@pytest.mark.parametrize("prompt", [REPEAT, "abcabcabcabcabcabcabc", "x" * 40, "no repeats here: 0123456789"])
def test_greedy_outputs_with_speculation_equal_plain_decoding(prompt: str) -> None:
    off, on, stats = _both(prompt, max_new_tokens=60)
    assert on.tokens == off.tokens and on.text == off.text
    last_on, last_off = on.outs[-1], off.outs[-1]
    assert (last_on.finish_reason, last_on.completion_tokens) == (last_off.finish_reason, last_off.completion_tokens)
    assert last_on.completion_tokens == len(on.tokens)
    assert stats["generated_tokens"] == len(on.tokens)
    assert stats["spec_accepted_tokens"] <= stats["spec_draft_tokens"]


def test_a_repetitive_prompt_accepts_drafts_in_fewer_steps() -> None:
    with engine() as (eng, runner):
        run(eng, req(REPEAT, temperature=0.0, max_new_tokens=80)).wait()
        plain_steps = runner.steps
    with engine(SPEC) as (eng, runner):
        run(eng, req(REPEAT, temperature=0.0, max_new_tokens=80)).wait()
        stats = eng.stats.snapshot()
        assert stats["spec_accepted_tokens"] > 0
        assert runner.steps < plain_steps
        assert any(n > 1 for batch in runner.batches for (_, start, n) in batch if start > len(REPEAT))


@pytest.mark.parametrize("max_new", [1, 2, 3, 7, 33])
def test_max_new_tokens_is_exact(max_new: int) -> None:
    off, on, _ = _both(REPEAT, max_new_tokens=max_new)
    assert len(on.tokens) == max_new == on.outs[-1].completion_tokens
    assert on.tokens == off.tokens and on.outs[-1].finish_reason == FinishReason.LENGTH


@contextmanager
def copying(config: SchedulerConfig, eos_at: int = 10_000) -> Iterator[Engine]:
    runner = CopyRunner(n_slots=2, n_ctx=512)
    runner.eos_at = eos_at
    eng = Engine(runner, config)
    eng.start()
    try:
        yield eng
    finally:
        eng.stop()


def _copied(config: SchedulerConfig, eos_at: int = 10_000, **params: object) -> tuple[Collector, dict[str, float]]:
    with copying(config, eos_at) as eng:
        c = run(eng, req(REPEAT, temperature=0.0, **params))
        c.wait()
        return c, eng.stats.snapshot()


@pytest.mark.parametrize("stop", ["mat", "the", "t. t", "sat on the mat. the cat"])
def test_stop_strings_see_every_accepted_token_in_order(stop: str) -> None:
    off, _ = _copied(SchedulerConfig(), max_new_tokens=60, stop=(stop,))
    on, stats = _copied(SPEC, max_new_tokens=60, stop=(stop,))
    assert off.text == REPEAT[: REPEAT.index(stop)]
    assert on.text == off.text and on.tokens == off.tokens
    assert on.outs[-1].finish_reason == off.outs[-1].finish_reason == FinishReason.STOP
    assert on.outs[-1].completion_tokens == off.outs[-1].completion_tokens == len(on.tokens)
    assert stats["generated_tokens"] == len(on.tokens)


def test_a_copied_text_is_mostly_drafted_and_length_is_exact() -> None:
    on, stats = _copied(SPEC, max_new_tokens=50)
    assert on.text == (REPEAT * 3)[:50] and on.outs[-1].finish_reason == FinishReason.LENGTH
    assert on.outs[-1].completion_tokens == 50 == stats["generated_tokens"]
    # " th" also precedes "e mat": one 3-gram draft goes wrong, is refused, and the text stays exact
    assert stats["spec_draft_tokens"] >= stats["spec_accepted_tokens"] >= 30
    assert stats["steps"] <= 12  # prefill + ~5 tokens a step, instead of 50 steps


def test_eos_inside_a_speculative_step_ends_the_sequence_there() -> None:
    eos_at = len(REPEAT) + 1 + 30  # the 31st generated token is EOS
    off, _ = _copied(SchedulerConfig(), eos_at, max_new_tokens=60)
    on, stats = _copied(SPEC, eos_at, max_new_tokens=60)
    assert on.tokens == off.tokens and len(on.tokens) == 31 and on.tokens[-1] == EOS_ID
    assert on.outs[-1].finish_reason == FinishReason.EOS and on.outs[-1].completion_tokens == 31
    assert stats["spec_draft_tokens"] > stats["spec_accepted_tokens"] > 0  # the drafts after the EOS are refused


def test_eos_from_the_reference_model_ends_where_plain_decoding_does() -> None:
    with engine(eos_slope=0.015) as (eng, _):
        off = run(eng, req(REPEAT, temperature=0.0, max_new_tokens=200))
        off.wait()
    with engine(SPEC, eos_slope=0.015) as (eng, _):
        on = run(eng, req(REPEAT, temperature=0.0, max_new_tokens=200))
        on.wait()
        assert eng.stats.snapshot()["spec_accepted_tokens"] > 0
    assert off.outs[-1].finish_reason == on.outs[-1].finish_reason == FinishReason.EOS
    assert on.tokens == off.tokens and on.outs[-1].completion_tokens == off.outs[-1].completion_tokens


def test_an_abort_mid_speculation_ends_cleanly_and_the_slot_serves_again() -> None:
    with engine() as (eng, _):
        ref = run(eng, req(REPEAT, temperature=0.0, max_new_tokens=60))
        ref.wait()
    with engine(SPEC) as (eng, runner):
        runner.gated = True
        r = req(REPEAT, temperature=0.0, max_new_tokens=60)
        c = run(eng, r)
        runner.release(12)
        wait_for(lambda: runner.steps == 12 and eng.stats.snapshot()["spec_draft_tokens"] > 0)
        eng.abort(r.request_id)
        runner.release(1)
        last = c.wait()
        assert last.finish_reason == FinishReason.CANCELLED
        assert c.tokens == ref.tokens[: len(c.tokens)] and last.completion_tokens == len(c.tokens)
        runner.gated = False
        runner.release(1000)
        again = run(eng, req(REPEAT, temperature=0.0, max_new_tokens=60))
        again.wait()
        assert again.tokens == ref.tokens
        assert eng.stats.snapshot()["running"] == 0


def test_sampled_and_greedy_requests_together_match_their_solo_runs() -> None:
    with engine() as (eng, _):
        solo = [run(eng, req(REPEAT, temperature=t, seed=5, max_new_tokens=40)) for t in (0.0, 0.8)]
        for c in solo:
            c.wait()
    with engine(SPEC) as (eng, _):
        both = [run(eng, req(REPEAT, temperature=t, seed=5, max_new_tokens=40)) for t in (0.0, 0.8)]
        for c in both:
            c.wait()
    assert [c.tokens for c in both] == [c.tokens for c in solo]


def test_bad_knobs_are_refused() -> None:
    for cfg in (SchedulerConfig(speculative_ngram=-1), SchedulerConfig(prompt_lookup_min=4, prompt_lookup_max=3),
                SchedulerConfig(prompt_lookup_min=0)):
        with pytest.raises(ValueError, match="prompt_lookup"):
            Scheduler(cfg, 2, frozenset())


def test_speculation_changes_the_system_fingerprint_and_off_changes_nothing() -> None:
    def fp(config: SchedulerConfig) -> str:
        runner = ReferenceRunner(n_slots=2)
        return fingerprint(ServedModel(runner, AsyncEngine(Engine(runner, config))))

    plain = fp(SchedulerConfig())
    assert fp(SchedulerConfig(speculative_ngram=0, prompt_lookup_max=5)) == plain  # off: knobs unused
    assert fp(SPEC) != plain and fp(SchedulerConfig(speculative_ngram=2)) not in (plain, fp(SPEC))


def test_concurrent_greedy_requests_with_speculation_match_their_solo_runs() -> None:
    prompts = [REPEAT, "abcabcabcabcabc", "x" * 40, "Numbers: 1, 2, 3, 4, 5, 6, 7, 8, 9, 10", REPEAT[:50], "Hi"]
    with engine() as (eng, _):
        solo = []
        for p in prompts:
            c = run(eng, req(p, temperature=0.0, max_new_tokens=40))
            c.wait()
            solo.append(c)
    with engine(SchedulerConfig(speculative_ngram=3, max_batch_tokens=64)) as (eng, _):
        together = [run(eng, req(p, temperature=0.0, max_new_tokens=40)) for p in prompts]
        for c in together:
            c.wait()
        assert eng.stats.snapshot()["spec_accepted_tokens"] > 0
    assert [c.tokens for c in together] == [c.tokens for c in solo]
    assert [c.outs[-1].completion_tokens for c in together] == [len(c.tokens) for c in solo]
