"""Adaptive speculative decoding (`--speculative-ngram auto`): drafts only where they are expected to pay,
learnt from every step; outputs never change (the reference backend is exact per position)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import numpy as np
import pytest

from sluicegate.backends.base import BatchItem, Logits
from sluicegate.backends.reference import ReferenceRunner
from sluicegate.engine import AsyncEngine, Engine, SchedulerConfig
from sluicegate.engine.scheduler import Scheduler, Seq
from sluicegate.engine.speculative import DraftPolicy, DraftRecord, propose, propose_n
from sluicegate.serving.models import ServedModel
from sluicegate.serving.openai_common import fingerprint
from tests.unit.test_engine import Collector, req, run
from tests.unit.test_speculative import REPEAT, CopyRunner

AUTO = SchedulerConfig()  # as shipped: adaptive drafting where the runner's verification is exact
OFF = SchedulerConfig(speculative_auto=0)


def test_the_bar_a_draft_must_clear_grows_with_the_rows_sharing_the_step() -> None:
    policy = DraftPolicy(8, row_cost=0.5, margin=1.0)
    assert policy.bar(1) == pytest.approx(0.5)
    assert policy.bar(2) == pytest.approx(2 / 3)
    assert policy.bar(8) == pytest.approx(4 / 4.5)
    assert policy.how_many(0.9, policy.bar(1), 8) == 6  # 0.9^6 = 0.53 >= 0.5 > 0.9^7
    assert policy.how_many(0.9, policy.bar(1), 3) == 3  # capped by the room
    assert policy.how_many(0.45, policy.bar(1), 8) == 0
    assert DraftPolicy(2).how_many(1.0, 0.5, 8) == 2  # capped by k_max
    assert DraftPolicy(8, row_cost=0.5).bar(1) == pytest.approx(0.6)  # by default a fifth more than break-even


def test_the_row_cost_is_measured_from_decode_steps() -> None:
    policy = DraftPolicy(8, row_cost=0.5, weight=0.5, relax=0.0, margin=1.0)
    policy.observe_step(2, 0.030)  # no lone step timed yet: nothing to measure a row against
    assert policy.cost == 0.5
    policy.observe_step(1, 0.010)
    for _ in range(30):
        policy.observe_step(3, 0.014)  # two more rows: 2 ms each, a fifth of a lone step
    assert policy.cost == pytest.approx(0.2)
    assert policy.bar(1) == pytest.approx(0.2)


def test_one_slow_step_does_not_decide_and_one_row_steps_relax_the_cost_back() -> None:
    policy = DraftPolicy(8, row_cost=0.5, weight=0.05, relax=0.05)
    policy.observe_step(1, 0.010)
    policy.observe_step(2, 1.0)  # a neighbour stalled this one: capped, and only a 5% step from the prior
    assert 0.5 < policy.cost < 0.6
    for _ in range(100):
        policy.observe_step(2, 0.040)  # rows that cost three steps each: the cap holds it at 1.5
    assert policy.cost == pytest.approx(1.5, rel=0.02)
    assert policy.bar(1) > 1.0  # no draft can pay now
    for _ in range(200):  # undrafted one-row steps: the estimate drifts back, so drafting is tried again
        policy.observe_step(1, 0.010)
    assert policy.cost < 0.6


def test_a_step_of_a_new_shape_measures_the_graph_rebuild() -> None:
    policy = DraftPolicy(8, weight=1.0, relax=0.0, margin=1.0)
    for _ in range(3):
        policy.observe_step(1, 0.010)  # one-row steps after one-row steps: the lone step
    assert policy.switch == pytest.approx(0.15)  # the prior, until measured
    policy.observe_step(2, 0.018)  # a draft row: 8 ms, less the rebuild it caused (1.5 ms by the prior)
    assert policy.row_s == pytest.approx(0.0065)
    policy.observe_step(1, 0.0125)  # back to one row: rebuilt again, 2.5 ms over the lone step
    assert policy.switch == pytest.approx(0.25)
    assert policy.lone_s == pytest.approx(0.010)  # not counted as a lone step
    policy.observe_step(0, 0.300)  # a prefill step: times nothing, but the next one-row step is a new shape
    policy.observe_step(1, 0.011)
    assert policy.lone_s == pytest.approx(0.010) and policy.switch == pytest.approx(0.1)


def test_drafts_that_change_the_shape_must_pay_for_two_rebuilds() -> None:
    policy = DraftPolicy(8, row_cost=0.5, switch_cost=0.15)  # margin 1.2
    assert not policy.worth(1, 1, 0.9)  # 0.9 kept against 1.2 * (0.5 + 0.3)
    assert policy.worth(1, 1, 0.97)
    assert not policy.worth(1, 2, 1.5) and policy.worth(1, 4, 3.3)
    assert not policy.worth(4, 1, 0.97)  # in a step of four rows a kept token is worth less time


def test_proposals_fed_or_not_teach_the_rate() -> None:
    policy = DraftPolicy(8, prior=4.0)
    rec = DraftRecord()
    assert policy.rate(3, rec) == pytest.approx(0.5)  # nothing known: even odds
    policy.observe(3, rec, [5, 6, 7], [5, 6, 9])  # two kept, then a disagreement
    assert (rec.hits, rec.misses) == (2, 1)
    policy.observe(3, rec, [5, 6], [5])  # a shadow proposal checked against the one token chosen: kept
    policy.observe(3, rec, [1, 2], [5])  # refused
    assert (rec.hits, rec.misses) == (3, 2)
    policy.observe(3, rec, [5, 6], [5, 6, 4])  # the tokens run past the proposal: no disagreement seen
    assert (rec.hits, rec.misses) == (5, 2)
    assert 0.5 < policy.rate(3, rec) < 5 / 7
    assert policy.sure_rate(3, rec) < policy.rate(3, rec)
    sure = DraftRecord(hits=90, misses=10)
    assert policy.rate(3, sure) - policy.sure_rate(3, sure) < policy.rate(3, rec) - policy.sure_rate(3, rec)
    assert policy.rate(2, DraftRecord()) == pytest.approx(0.5)  # another n-gram length: its own rate


def test_propose_n_finds_what_propose_finds_and_the_length_that_matched() -> None:
    rng = np.random.default_rng(0)
    for _ in range(300):
        ctx = [int(t) for t in rng.integers(0, 4, size=int(rng.integers(1, 40)))]
        drafts, n = propose_n(ctx, 5, 3, 2)
        assert drafts == propose(ctx, 5, 3, 2)
        if drafts:
            tail = ctx[len(ctx) - n :]
            assert any(ctx[i : i + n] == tail and ctx[i + n : i + n + len(drafts)] == drafts
                       for i in range(len(ctx) - n))
        else:
            assert n == 0


@contextmanager
def served(config: SchedulerConfig, runner: ReferenceRunner, *, row_cost: float = 0.5) -> Iterator[Engine]:
    """An engine whose drafting policy keeps `row_cost` (the reference backend's own step times are not a
    CPU's: pinned so the tests do not depend on them)."""
    eng = Engine(runner, config)
    if eng.scheduler.drafting is not None:
        eng.scheduler.drafting.row_cost = row_cost
        eng.scheduler.drafting.timed = False
    eng.start()
    try:
        yield eng
    finally:
        eng.stop()


def _generate(config: SchedulerConfig, runner: ReferenceRunner, prompt: str | list[int],
              max_new: int = 60) -> tuple[Collector, dict[str, float]]:
    with served(config, runner) as eng:
        c = run(eng, req(prompt, temperature=0.0, max_new_tokens=max_new))
        c.wait()
        return c, eng.stats.snapshot()


PERIODIC = "abcdefghijklmnopqrstuvwx" * 6  # the copying model continues it; every 2-gram predicts the next exactly


def test_a_repeating_text_is_drafted_and_the_output_is_unchanged() -> None:
    off, plain = _generate(OFF, CopyRunner(n_slots=2, n_ctx=512, decoded_kv_exact=True), PERIODIC)
    on, stats = _generate(AUTO, CopyRunner(n_slots=2, n_ctx=512, decoded_kv_exact=True), PERIODIC)
    assert on.tokens == off.tokens and on.text == off.text == (PERIODIC * 3)[:60]
    assert on.outs[-1].completion_tokens == 60 == stats["generated_tokens"]
    assert plain["spec_draft_tokens"] == 0
    assert stats["spec_accepted_tokens"] >= 40
    assert stats["steps"] <= plain["steps"] / 2


def test_a_text_that_half_repeats_is_not_drafted_where_the_rebuilds_would_eat_the_gain() -> None:
    # REPEAT's 3-grams are ambiguous ("the" goes on as " cat" or " mat"): about 0.8 of guesses are right,
    # which pays for two draft rows but not for them and a graph rebuild each way
    on, stats = _generate(AUTO, CopyRunner(n_slots=2, n_ctx=512, decoded_kv_exact=True), REPEAT)
    assert on.outs[-1].completion_tokens == 60
    assert stats["spec_draft_tokens"] <= 8


class WrongGuessRunner(ReferenceRunner):
    """Greedy text whose every 2-gram occurs in the prompt followed by another token: each proposal is wrong."""

    @staticmethod
    def token_at(pos: int) -> int:
        return 10 + (pos * 37) % 97

    def execute(self, batch: Sequence[BatchItem]) -> Logits:
        super().execute(batch)
        rows = []
        for item in batch:
            end = item.start_pos + len(item.token_ids)
            for p in range(item.start_pos if item.logits_all else end - 1, end) if item.want_logits else ():
                row = np.zeros(self.limits.n_vocab, np.float32)
                row[self.token_at(p + 1)] = 1.0
                rows.append(row)
        return np.stack(rows) if rows else np.zeros((0, self.limits.n_vocab), np.float32)


def _misleading_prompt(length: int, new: int) -> list[int]:
    """Ends with the text's own token at its position; holds every pair of the coming text followed by a decoy."""
    t = WrongGuessRunner.token_at
    body = [x for p in range(length + 1, length + new + 1) for x in (t(p - 1), t(p), 200 + p % 50)]
    prompt = [256, *body]
    prompt += [0] * (length - 1 - len(prompt))
    return [*prompt, t(length - 1)]


def test_wrong_guesses_stop_being_fed_but_keep_being_checked() -> None:
    prompt = _misleading_prompt(300, 60)
    off, _ = _generate(OFF, WrongGuessRunner(n_slots=2, n_ctx=512, decoded_kv_exact=True), prompt)
    on, stats = _generate(AUTO, WrongGuessRunner(n_slots=2, n_ctx=512, decoded_kv_exact=True), prompt)
    assert on.tokens == off.tokens == [WrongGuessRunner.token_at(p) for p in range(300, 360)]
    assert stats["spec_accepted_tokens"] == 0
    assert stats["spec_draft_tokens"] <= 2  # at most the first guesses, while nothing was known


def test_no_drafting_where_verification_is_not_exact() -> None:
    s = Scheduler(AUTO, 2, frozenset(), exact_replies=False)
    assert s.drafting is None
    _, stats = _generate(AUTO, CopyRunner(n_slots=2, n_ctx=512), REPEAT)
    assert stats["spec_draft_tokens"] == 0


def _decoding(s: Scheduler, prompt: str, hits: int) -> Seq:
    """A greedy sequence past its prompt, with a record of good guesses."""
    seq = Seq(req(prompt, temperature=0.0, max_new_tokens=100), 0)
    s.add(seq)
    out = s.schedule(0.0)
    s.update(out, [int(REPEAT.encode()[0])] * sum(1 for c in out.chunks if c.want_logits), 0.0)
    seq.drafts.hits = hits
    return seq


def test_no_drafts_in_a_step_that_prefills_and_none_proposed_for_a_crowd() -> None:
    s = Scheduler(AUTO, 16, frozenset(), exact_replies=True)
    a = _decoding(s, REPEAT, 100)
    out = s.schedule(0.0)
    assert out.chunks[0].n_draft > 0  # alone and reliable: drafted
    s.update(out, [0] * (1 + out.chunks[0].n_draft), 0.0)
    s.add(Seq(req("another prompt, waiting for its prefill", temperature=0.0), 0))
    out = s.schedule(0.0)
    assert [c.n_draft for c in out.chunks if c.seq is a] == [0]  # the arrival's prompt goes in this step
    s.update(out, [0] * sum(1 for c in out.chunks if c.want_logits), 0.0)
    crowd = [_decoding(s, REPEAT, 100) for _ in range(10)]
    out = s.schedule(0.0)
    assert all(not c.in_prefill for c in [a, *crowd])
    assert all(c.n_draft == 0 and not c.proposal for c in out.chunks)  # 12 rows: a guess cannot pay


def test_adaptive_drafting_leaves_the_fingerprint_alone() -> None:
    def fp(config: SchedulerConfig) -> str:
        runner = ReferenceRunner(n_slots=2, decoded_kv_exact=True)
        return fingerprint(ServedModel(runner, AsyncEngine(Engine(runner, config))))

    assert fp(AUTO) == fp(OFF)  # it cannot change an output: nothing to tell a client
    assert fp(SchedulerConfig(speculative_ngram=3)) != fp(OFF)
