"""Deadline admission's arithmetic (engine/forecast.py): the measured speed, the load, the three verdicts."""

from __future__ import annotations

import math

import pytest

from sluicegate.engine import EngineRequest, Priority, SamplingParams
from sluicegate.engine.forecast import (
    HEADROOM,
    MIN_BUSY_S,
    MIN_STEPS,
    Load,
    Shape,
    Speed,
    Throughput,
    Verdict,
    expected_new,
    forecast,
    judge,
    load_of,
    retry_after_s,
)

# 100 tokens/s of busy time, 10 ms a step; at best 1,000 tokens/s and 5 ms a step
SPEED = Speed(rate=100.0, step_s=0.01, peak_rate=1000.0, fastest_step_s=0.005, busy_s=10.0, steps=1000)
SHAPE = Shape(n_slots=4, chunk_tokens=512)


def request(prompt: int = 10, new: int = 100, *, deadline: float | None = None, first: float | None = None,
            estimated: int | None = None, priority: Priority = Priority.INTERACTIVE) -> EngineRequest:
    return EngineRequest("r", [1] * prompt, SamplingParams(max_new_tokens=new), arrival=0.0, priority=priority,
                         deadline=deadline, first_token_deadline=first, estimated_new_tokens=estimated)


def test_the_load_of_the_queues() -> None:
    from sluicegate.engine.scheduler import Seq

    running = Seq(request(prompt=100, new=50, estimated=20), seed=0)
    running.num_computed, running.output_ids = 100, [1] * 5  # prefilled, 5 of its expected 20 out
    batch = Seq(request(prompt=10, new=50, priority=Priority.BATCH), seed=0)
    load = load_of([running], [Seq(request(prompt=30, new=8), seed=0), batch])
    assert (load.running, load.running_work) == (1, 15)
    assert load.ahead_of(Priority.INTERACTIVE) == (1, 15 + 38)
    assert load.ahead_of(Priority.BATCH) == (2, 15 + 38 + 60)
    assert load.copy().merge(load).ahead_of(Priority.BATCH) == (4, 15 + 2 * (38 + 60))  # running counted once


def test_the_averages_follow_busy_time_and_keep_the_best_ever_seen() -> None:
    t = Throughput()
    assert not t.speed.measured
    t.observe(100, 1.0)  # the first observation is taken as is
    assert t.speed.rate == 100.0 and t.speed.step_s == 1.0
    t.observe(0, 0.5)  # a step without tokens (or time) says nothing
    assert t.speed.steps == 1
    for _ in range(MIN_STEPS):
        t.observe(1, 0.01)  # decode steps: 100 tokens/s, 10 ms each
    s = t.speed
    assert s.measured and s.busy_s >= MIN_BUSY_S
    assert s.peak_rate == 100.0 and s.fastest_step_s == 0.01
    assert 0.01 < s.step_s < 1.0 and s.rate == pytest.approx(100.0)
    t.observe(500, 0.1)  # a long prompt chunk: 5,000 tokens/s
    assert t.speed.peak_rate == 5000.0 and t.speed.rate > 100.0


def test_a_short_measurement_refuses_nothing() -> None:
    young = Speed(rate=100.0, step_s=0.01, peak_rate=100.0, fastest_step_s=0.01, busy_s=0.5, steps=50)
    assert forecast(young, Load(), SHAPE, 10, 100, Priority.INTERACTIVE) is None
    j = judge(young, Load(running=4, running_work=10**9), SHAPE, request(deadline=0.001), now=0.0)
    assert j.verdict is Verdict.FITS


def test_a_free_slot_means_no_wait() -> None:
    load = Load(running=2, running_work=5000)
    f = forecast(SPEED, load, SHAPE, 10, 100, Priority.INTERACTIVE)
    assert f is not None and f.wait_s == 0.0
    assert f.first_token_s == pytest.approx(0.01)  # the prompt fits one chunk: one step gives the first token
    assert f.total_s == pytest.approx(0.01 + 99 * 0.01)  # then one token a step
    assert f.idle_first_token_s == pytest.approx(10 / 1000)  # the prompt at the best rate seen
    assert f.idle_total_s == pytest.approx(10 / 1000 + 99 * 0.005)
    long = forecast(SPEED, load, SHAPE, 1500, 1, Priority.INTERACTIVE)  # three chunks, at least 1.5 s at best
    assert long is not None and long.first_token_s == pytest.approx(1.5) and long.idle_first_token_s == 1.5
    many = forecast(SPEED, load, Shape(4, 100), 1000, 1, Priority.INTERACTIVE)  # ten chunks of a step each
    assert many is not None and many.first_token_s == pytest.approx(1.0)


def test_full_slots_wait_for_the_work_ahead_of_the_same_or_higher_priority() -> None:
    load = Load(running=4, running_work=300, work={Priority.INTERACTIVE: 200, Priority.BATCH: 100_000},
                waiting={Priority.INTERACTIVE: 2, Priority.BATCH: 50})
    f = forecast(SPEED, load, SHAPE, 10, 100, Priority.INTERACTIVE)
    assert f is not None and f.wait_s == pytest.approx(5.0)  # the waiting batch work goes after it
    b = forecast(SPEED, load, SHAPE, 10, 100, Priority.BATCH)
    assert b is not None and b.wait_s == pytest.approx(1005.0)


def test_verdicts() -> None:
    busy = Load(running=4, running_work=500)  # 5 s of work ahead
    assert judge(SPEED, busy, SHAPE, request(), now=0.0).verdict is Verdict.FITS  # no deadline
    assert judge(SPEED, busy, SHAPE, request(deadline=7.0), now=0.0).verdict is Verdict.FITS  # 6.0 s, +10%
    assert judge(SPEED, busy, SHAPE, request(deadline=6.5), now=0.0).verdict is Verdict.SHED  # no headroom left
    shed = judge(SPEED, busy, SHAPE, request(deadline=4.5), now=0.0)
    assert shed.verdict is Verdict.SHED and shed.needed_s == pytest.approx(6.0 * (1 + HEADROOM))
    assert shed.left_s == 4.5 and shed.retry_after == 3 and shed.wait_s == pytest.approx(5.0)
    assert not shed.first_token
    never = judge(SPEED, Load(), SHAPE, request(deadline=0.4), now=0.0)  # 100 tokens take 0.5 s at best
    assert never.verdict is Verdict.NEVER and never.needed_s == pytest.approx(0.505)
    # a stream's first token: the prompt and one step
    first = judge(SPEED, busy, SHAPE, request(first=1.0), now=0.0)
    assert first.verdict is Verdict.SHED and first.first_token
    assert judge(SPEED, busy, SHAPE, request(prompt=2000, first=1.0), now=0.0).verdict is Verdict.NEVER
    assert judge(SPEED, Load(), SHAPE, request(deadline=100.0, first=1.0), now=0.0).verdict is Verdict.FITS
    # time the server spent before submitting (arrival 0, now 0.3) is its own: not enough left is SHED
    late = judge(SPEED, Load(), SHAPE, request(deadline=0.6), now=0.3)
    assert late.verdict is Verdict.SHED and late.left_s == pytest.approx(0.3)
    assert judge(SPEED, Load(), SHAPE, request(deadline=0.6), now=0.7).verdict is Verdict.SHED  # already past


def test_the_estimate_of_new_tokens_counts_not_the_limit() -> None:
    assert expected_new(request(new=2000, estimated=256)) == 256
    assert expected_new(request(new=100, estimated=256)) == 100
    assert expected_new(request(new=100)) == 100
    # 2,000 tokens could never fit 5 s; the 256 the serving core expects do
    assert judge(SPEED, Load(), SHAPE, request(new=2000, estimated=256, deadline=5.0), 0.0).verdict is Verdict.FITS


def test_retry_after_is_whole_seconds_between_1_and_60() -> None:
    assert retry_after_s(0.01) == 1 and retry_after_s(2.5) == 3 and retry_after_s(1e6) == 60
    assert retry_after_s(-1.0) == 1 and not math.isnan(retry_after_s(0.0))


def test_the_step_time_follows_the_batch_the_request_would_join() -> None:
    """Measured at 16 sequences a step (150 ms) with a 10 ms lone step: a request joining an empty engine is
    forecast at the lone step's pace, one joining a full batch at the full batch's."""
    from dataclasses import replace

    from sluicegate.engine.forecast import Load, step_at

    busy = replace(SPEED, step_s=0.15, fastest_step_s=0.01, batch=16.0)
    shape = Shape(n_slots=16, chunk_tokens=512)
    assert step_at(busy, 1) == 0.01 and abs(step_at(busy, 16) - 0.15) < 1e-9
    idle = forecast(busy, Load(), shape, 10, 64, Priority.INTERACTIVE)
    full = forecast(busy, Load(running=15, running_work=15 * 32), shape, 10, 64, Priority.INTERACTIVE)
    assert idle is not None and full is not None
    assert idle.total_s < 1.0 < 9.0 < full.total_s  # 63 x 10 ms, against 63 x 150 ms
    # so after a burst measured at full load, an idle engine admits a 10 s request again
    req = request(prompt=10, new=64, deadline=10.0)
    assert judge(busy, Load(), shape, req, now=0.0).verdict is Verdict.FITS
    assert judge(busy, Load(running=15, running_work=15 * 32), shape, req, now=0.0).verdict is Verdict.SHED


def test_the_batch_size_is_averaged_over_busy_time() -> None:
    t = Throughput()
    t.observe(16, 0.15, seqs=16)
    assert t.speed.batch == 16
    for _ in range(400):
        t.observe(1, 0.05, seqs=1)  # 20 s of lone steps: four time constants
    assert t.speed.batch < 1.5
