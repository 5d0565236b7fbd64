"""Deadline admission's arithmetic (engine/forecast.py): the calibrated step model and its correction, the plan
of slots, the three verdicts, and the way back from a wrong estimate."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from sluicegate.engine import EngineRequest, Priority, SamplingParams
from sluicegate.engine.forecast import (
    ALPHA,
    COLD_HEADROOM,
    DECAY_S,
    HEADROOM,
    MAX_RATIO,
    Calibration,
    Load,
    Shape,
    Speed,
    Throughput,
    Verdict,
    Work,
    expected_new,
    forecast,
    judge,
    load_of,
    retry_after_s,
)

# 10 ms a decode step of one sequence, 150 ms of 16 (the ~15x a CPU shows), 1 ms a prompt token
CAL = Calibration(n_slots=16, step_1=0.01, step_n=0.15, token_s=0.001)
SPEED = Speed(CAL, sure=1.0)  # confirmed by recent steps (at 0): the forecast carries `HEADROOM` at time 0
SHAPE = Shape(n_slots=16, chunk_tokens=512)


def request(prompt: int = 10, new: int = 100, *, deadline: float | None = None, first: float | None = None,
            estimated: int | None = None, priority: Priority = Priority.INTERACTIVE, judged: bool = True,
            rid: str = "r") -> EngineRequest:
    return EngineRequest(rid, [1] * prompt, SamplingParams(max_new_tokens=new), arrival=0.0, priority=priority,
                         deadline=deadline, first_token_deadline=first, estimated_new_tokens=estimated,
                         judged=judged)


def running(n: int, new: int, deadline: float | None = None) -> Load:
    return Load([Work(0, new, deadline=deadline, key=f"run{i}") for i in range(n)])


def test_the_load_of_the_queues() -> None:
    from sluicegate.engine.scheduler import Seq

    run = Seq(request(prompt=100, new=50, estimated=20, deadline=9.0), seed=0)
    run.num_computed, run.output_ids = 100, [1] * 5  # prefilled, 5 of its expected 20 out
    own = Seq(request(prompt=30, new=8, deadline=5.0, judged=False), seed=0)
    batch = Seq(request(prompt=10, new=50, priority=Priority.BATCH), seed=0)
    load = load_of([run], [batch, own])
    assert load.running == [Work(0, 15, Priority.INTERACTIVE, 9.0, "r")]
    assert [w.new for w in load.waiting] == [8, 50]  # arrival order (the plan orders by priority itself)
    assert load.waiting[0].deadline is None  # the server's deadline is not kept by admission
    assert load.tokens == 15 + 60 + 38
    assert len(load.copy().merge(load).waiting) == 4 and len(load.running) == 1


def test_the_step_time_follows_the_batch() -> None:
    assert CAL.step(1) == 0.01 and CAL.step(16) == pytest.approx(0.15) and CAL.step(100) == pytest.approx(0.15)
    assert CAL.step(0) == 0.01 and CAL.step(6) == pytest.approx(0.01 + 0.14 * 5 / 15)
    assert CAL.cost(1, 100) == pytest.approx(0.11)
    assert Calibration(1, 0.02, 0.02, 0.0).step(5) == 0.02


def test_the_step_time_is_linear_between_the_measured_batches() -> None:
    """A CPU's step jumps from one sequence to two, then grows by each sequence's share: measured at 1, 2, 4,
    8 and 16 (engine/calibrate.py), the batches a burst fills are forecast at what they take, not on a line
    from 1 to 16 that under-estimated them by up to 27%."""
    c = Calibration(16, 0.008, 0.065, 0.003, ((2, 0.015), (4, 0.023), (8, 0.037)))
    assert c.step(1) == 0.008 and c.step(2) == 0.015 and c.step(8) == 0.037 and c.step(16) == 0.065
    assert c.step(3) == pytest.approx(0.019) and c.step(12) == pytest.approx(0.051)
    assert c.step(40) == 0.065 and c.step(0) == 0.008
    assert c.step(2) > replace(c, between=()).step(2) * 1.2  # the line's forecast at two
    odd = Calibration(16, 0.01, 0.05, 0.0, ((2, 0.03), (4, 0.02)))  # a noisy measurement never makes it shrink
    assert [odd.step(b) for b in (2, 3, 4)] == [0.03, 0.03, 0.03] and odd.step(16) == 0.05


def test_one_slow_step_barely_moves_the_estimate() -> None:
    """A slow first prefill followed by ordinary steps: every step weighs the same, so the estimate stays at the
    calibration (an average weighted by step length took the slow one for the norm: 14x too slow, shut)."""
    t = Throughput()
    t.observe(1, 0, 0.01, now=0.0)
    assert not t.speed.measured  # nothing before calibration
    t.calibrate(CAL, now=0.0)
    t.observe(0, 30, 3.0, now=3.0)  # 3 s for a 30-token prompt: ~75x its model
    assert t.speed.prompt_scale(3.0) == pytest.approx(MAX_RATIO ** ALPHA)  # clamped, and one step among many
    assert t.speed.scale(3.0) == 1.0  # a prompt's cost is not a decode step's
    for k in range(30):
        t.observe(1, 0, 0.01, now=3.0 + 0.01 * k)
    assert t.speed.scale(3.3) < 1.05 and t.speed.prompt_scale(3.3) < 1.2
    f = forecast(t.speed, Load(), SHAPE, 10, 64, Priority.INTERACTIVE, now=3.3)
    assert f is not None and f.total_s < 1.0  # an idle engine: 0.02 + 0.01 + 63 x 10 ms, not 10 s


def test_the_correction_follows_a_slower_machine_and_decays_when_idle() -> None:
    t = Throughput()
    t.calibrate(CAL, now=0.0)
    for k in range(100):  # every step twice its calibration: another process holds the cores
        t.observe(1, 0, 0.02, now=k * 0.02)
    busy = t.speed
    assert busy.scale(2.0) == pytest.approx(2.0, rel=0.01)
    req = request(new=300, deadline=2.0 + 5.0)  # 3 s at the calibration, 6 s at the measured speed
    assert judge(busy, Load(), SHAPE, req, now=2.0).verdict is Verdict.SHED
    # nothing admitted, nothing measured: the estimate returns towards the calibration on its own
    later = 2.0 + 5 * DECAY_S
    assert busy.scale(later) < 1.1
    late = request(new=300, deadline=later + 5.0)
    assert judge(busy, Load(), SHAPE, late, now=later).verdict is Verdict.FITS


def test_a_slow_calibration_is_corrected_by_the_long_run() -> None:
    """Calibrated while other work held the cores (twice too slow): an idle engine decays towards the long-run
    correction, not back to the calibration's pessimism."""
    t = Throughput()
    t.calibrate(CAL, now=0.0)
    for k in range(1000):
        t.observe(1, 0, 0.005, now=k * 0.005)
    s = t.speed
    assert s.scale(1000.0) < 0.6 and s.best_scale(1000.0) == s.scale(1000.0)
    never = judge(Speed(CAL), Load(), SHAPE, request(new=400, deadline=3.5), now=0.0)
    assert never.verdict is Verdict.NEVER  # 4 s at the calibration
    # 2 s at the long-run speed, with the unconfirmed headroom (an engine idle that long): 3 s
    assert judge(s, Load(), SHAPE, request(new=400, deadline=1000.0 + 3.5), now=1000.0).verdict is Verdict.FITS


def test_an_estimate_no_step_has_confirmed_carries_more_headroom() -> None:
    """A fresh calibration is a few seconds' measurement and a burst is judged whole before its first step: it
    must fit with `COLD_HEADROOM`; steps at the calibrated speed bring the headroom down to `HEADROOM`, and idle
    time brings it back up."""
    t = Throughput()
    t.calibrate(CAL, now=0.0)
    assert t.speed.headroom(0.0) == pytest.approx(COLD_HEADROOM)
    f = forecast(t.speed, Load(), SHAPE, 10, 100, Priority.INTERACTIVE)
    assert f is not None
    req = request(deadline=f.total_s * (1 + HEADROOM) + 0.01)  # fits a confirmed estimate, not a fresh one
    assert judge(t.speed, Load(), SHAPE, req, now=0.0).verdict is Verdict.SHED
    for k in range(1, 101):
        t.observe(1, 0, 0.01, now=k * 0.01)
    assert t.speed.headroom(1.0) < HEADROOM + 0.01
    assert judge(replace(t.speed, at=0.0), Load(), SHAPE, req, now=0.0).verdict is Verdict.FITS
    assert t.speed.headroom(1.0 + 3 * DECAY_S) > COLD_HEADROOM - 0.05  # idle: unconfirmed again
    # a burst (more requests than slots within a second) is judged as unconfirmed, however confirmed before
    assert judge(replace(t.speed, at=0.0), Load(), SHAPE, req, now=0.0, burst=True).verdict is Verdict.SHED


def test_a_free_slot_means_no_wait_and_a_full_engine_waits_for_the_first_to_end() -> None:
    f = forecast(SPEED, running(2, 5000), SHAPE, 10, 100, Priority.INTERACTIVE)
    step = CAL.step(3)
    assert f is not None and f.wait_s == 0.0 and f.step_s == pytest.approx(step)
    assert f.first_token_s == pytest.approx(step + 10 * 0.001)  # one chunk: one step, plus its tokens
    assert f.total_s == pytest.approx(step + 0.01 + 99 * step)
    assert f.idle_total_s == pytest.approx(0.01 + 0.01 + 99 * 0.01)
    two = Shape(n_slots=2, chunk_tokens=512)
    cal2 = Speed(Calibration(2, 0.01, 0.02, 0.0))
    full = Load([Work(0, 100), Work(0, 300)])
    f = forecast(cal2, full, two, 10, 10, Priority.INTERACTIVE)
    assert f is not None and f.wait_s == pytest.approx(100 * 0.02)  # the shorter one ends first
    queued = Load(list(full.running), [Work(10, 50), Work(10, 1000, Priority.BATCH)])
    f = forecast(cal2, queued, two, 10, 10, Priority.INTERACTIVE)  # behind the interactive one, not the batch
    assert f is not None and f.wait_s == pytest.approx(100 * 0.02 + 0.02 + 49 * 0.02)  # after the other one
    b = forecast(cal2, queued, two, 10, 10, Priority.BATCH)
    assert b is not None and b.wait_s == pytest.approx(300 * 0.02)  # the batch one ahead took the first slot


def test_verdicts() -> None:
    busy = running(16, 40)  # 40 steps of 150 ms: 6 s until a slot is free
    assert judge(SPEED, busy, SHAPE, request(), now=0.0).verdict is Verdict.FITS  # no deadline
    f = forecast(SPEED, busy, SHAPE, 10, 100, Priority.INTERACTIVE)
    assert f is not None and f.wait_s == pytest.approx(6.0)
    fits = judge(SPEED, busy, SHAPE, request(deadline=f.total_s * (1 + HEADROOM) + 0.01), now=0.0)
    assert fits.verdict is Verdict.FITS
    shed = judge(SPEED, busy, SHAPE, request(deadline=f.total_s), now=0.0)  # no headroom left
    assert shed.verdict is Verdict.SHED and shed.needed_s == pytest.approx(f.total_s * (1 + HEADROOM))
    assert shed.wait_s == pytest.approx(6.0) and 1 <= shed.retry_after <= 60 and not shed.displaces
    never = judge(SPEED, Load(), SHAPE, request(deadline=0.4), now=0.0)  # 100 tokens take ~1 s at best
    assert never.verdict is Verdict.NEVER and never.needed_s == pytest.approx(0.01 + 0.01 + 99 * 0.01)
    first = judge(SPEED, busy, SHAPE, request(first=1.0), now=0.0)  # a stream's first token waits 6 s
    assert first.verdict is Verdict.SHED and first.first_token
    # time the server spent before submitting (arrival 0, now 0.6) is its own: not enough left is SHED
    late = judge(SPEED, Load(), SHAPE, request(new=50, deadline=1.0), now=0.6)
    assert late.verdict is Verdict.SHED and late.left_s == pytest.approx(0.4)


def test_a_deadline_the_caller_did_not_set_never_refuses() -> None:
    """No timeout header: the server's cap bounds the request (it ends there) but no forecast refuses it."""
    busy = running(16, 10_000)
    for deadline in (0.001, 1.0, 1800.0):
        j = judge(SPEED, busy, SHAPE, request(new=2000, deadline=deadline, judged=False), now=0.0)
        assert j.verdict is Verdict.FITS and j.forecast is not None  # still forecast (its error is measured)
    # a stream's first-token deadline is always the caller's (an SDK's read timeout)
    assert judge(SPEED, busy, SHAPE, request(first=1.0, judged=False), now=0.0).verdict is Verdict.SHED


def test_a_request_that_would_push_a_running_one_past_its_deadline_is_shed() -> None:
    """Five running, each with 64 tokens left and 3.9 s to go: at batch 5 they need 64 x 47 ms = 3.0 s (+10%:
    3.3 s); a sixth would make every step 57 ms (3.6 s, +10%: 4.0 s): over. It fits its own deadline, but is
    shed."""
    load = running(5, 64, deadline=3.9)
    alone = forecast(SPEED, load, SHAPE, 10, 8, Priority.INTERACTIVE)
    assert alone is not None and alone.total_s < 1.0
    j = judge(SPEED, load, SHAPE, request(new=8, deadline=100.0), now=0.0)
    assert j.verdict is Verdict.SHED and j.displaces and "running" in j.describe()
    assert j.needed_s > j.left_s == 3.9
    # the same with no deadline among the running: admitted; one already late is not protected at others' cost
    assert judge(SPEED, running(5, 64), SHAPE, request(new=8, deadline=100.0), now=0.0).verdict is Verdict.FITS
    assert judge(SPEED, running(5, 64, deadline=1.0), SHAPE, request(new=8, deadline=100.0),
                 now=0.0).verdict is Verdict.FITS
    # lower-priority waiting work is scheduled after it by design: not protected from it either
    behind = Load(running(4, 64).running, [Work(10, 64, Priority.BATCH, deadline=4.0)])
    assert judge(SPEED, behind, SHAPE, request(new=8, deadline=100.0), now=0.0).verdict is Verdict.FITS


def test_the_estimate_of_new_tokens_counts_not_the_limit() -> None:
    assert expected_new(request(new=2000, estimated=256)) == 256
    assert expected_new(request(new=100, estimated=256)) == 100
    assert expected_new(request(new=100)) == 100
    # 2,000 tokens could never fit 5 s; the 256 the serving core expects do
    assert judge(SPEED, Load(), SHAPE, request(new=2000, estimated=256, deadline=5.0), 0.0).verdict is Verdict.FITS


def test_no_calibration_no_forecast() -> None:
    assert forecast(Speed(), Load(), SHAPE, 10, 100, Priority.INTERACTIVE) is None
    assert judge(Speed(), running(16, 10**6), SHAPE, request(deadline=0.001), now=0.0).verdict is Verdict.FITS
    assert Speed().rate(0.0) == 0.0 and SPEED.rate(0.0) == pytest.approx(16 / 0.15)


def test_retry_after_is_whole_seconds_between_1_and_60() -> None:
    assert retry_after_s(0.01) == 1 and retry_after_s(2.5) == 3 and retry_after_s(1e6) == 60
    assert retry_after_s(-1.0) == 1 and not math.isnan(retry_after_s(0.0))


def test_the_correction_learns_each_end_of_the_batch_range() -> None:
    """Calibrated at 10 ms for one sequence and 150 ms for 16 while a neighbour held the cores at the start: the
    machine really does 5 ms and 150 ms. Steps of both sizes teach each end its own correction."""
    t = Throughput()
    t.calibrate(CAL, now=0.0)
    now = 0.0
    for _ in range(200):
        for d, secs in ((1, 0.005), (16, 0.15)):
            now += secs
            t.observe(d, 0, secs, now)
    s = t.speed
    assert s.scale(now, 1) == pytest.approx(0.5, rel=0.05) and s.scale(now, 16) == pytest.approx(1.0, rel=0.05)
    assert s.scale(now, 8) == pytest.approx(math.sqrt(0.5), rel=0.05)  # log-linear in between


def test_an_empty_engine_admits_a_probe_that_the_forecast_refuses() -> None:
    """A calibration twice too slow says 100 tokens need 2 s: a 1.5 s budget would be refused for good (nothing
    admitted, nothing measured). An empty engine admits it as a probe, within twice the time left."""
    slow = Speed(Calibration(16, 0.02, 0.3, 0.0))
    req = request(new=100, deadline=1.5)
    assert judge(slow, Load(), SHAPE, req, now=0.0).verdict is Verdict.NEVER
    j = judge(slow, Load(), SHAPE, req, now=0.0, probe=True)
    assert j.verdict is Verdict.FITS and j.probe
    # not while anything runs or waits (a probe takes no compute from anyone), nor far beyond its budget
    assert not judge(slow, running(1, 10), SHAPE, req, now=0.0, probe=True).probe
    assert not judge(slow, Load(waiting=[Work(1, 1)]), SHAPE, req, now=0.0, probe=True).probe
    assert judge(slow, Load(), SHAPE, request(new=100, deadline=0.9), now=0.0, probe=True).verdict is Verdict.NEVER
    # and never for a request that would not be refused anyway
    assert not judge(SPEED, Load(), SHAPE, req, now=0.0, probe=True).probe


def test_a_prefill_that_starts_while_a_request_runs_delays_it() -> None:
    """The steps that carry a new prompt carry every running sequence too: a request running beside seven
    prompts waiting to be prefilled ends later, by their cost, than one running alone."""
    from sluicegate.engine.forecast import plan

    alone, _ = plan(SPEED, running(1, 100), SHAPE, 0.0)
    crowded = Load([Work(0, 100, key="run0")], [Work(500, 100, key=f"w{i}") for i in range(7)])
    beside, _ = plan(SPEED, crowded, SHAPE, 0.0)
    first_alone, first_beside = alone[0][1], beside[0][1]
    step, scale = CAL.step(8), SPEED.scale(0.0, 8)
    assert first_beside - 100 * step * scale == pytest.approx(7 * 500 * CAL.token_s * scale)
    assert first_beside > first_alone


def test_prompt_tokens_the_cache_serves_are_not_charged() -> None:
    """A prompt sharing a long prefix with one computed lately (engine/reuse.py) is forecast at the tokens it
    computes: admitted where its whole prompt would not fit, and the requests running beside it are charged
    only that much of a stall."""
    busy = running(8, 20)
    whole = forecast(SPEED, busy, SHAPE, 1000, 20, Priority.INTERACTIVE)
    served = forecast(SPEED, busy, SHAPE, 40, 20, Priority.INTERACTIVE)
    assert whole is not None and served is not None and served.total_s < whole.total_s - 0.9
    req = request(prompt=1000, new=20, deadline=served.total_s * (1 + HEADROOM) + 0.01)
    assert judge(SPEED, busy, SHAPE, req, now=0.0).verdict is Verdict.SHED
    assert judge(SPEED, busy, SHAPE, req, now=0.0, cached=960).verdict is Verdict.FITS


def test_prompt_tokens_beside_decodes_correct_their_own_cost() -> None:
    """Decode steps at their calibration, and steps that also carry 20 prompt tokens at twice the calibrated
    cost a token (prompt tokens beside 16 decodes cost that here): the prompt correction learns 2, the decode one
    stays at 1 (one correction for both made every decode step 8% slower than it was)."""
    t = Throughput()
    t.calibrate(CAL, now=0.0)
    now = 0.0
    for _ in range(200):
        for p, secs in ((0, 0.15), (20, 0.15 + 20 * 0.002), (0, 0.15)):
            now += secs
            t.observe(16, p, secs, now)
    s = t.speed
    assert s.scale(now, 16) == pytest.approx(1.0, rel=0.02)
    assert s.prompt_scale(now) == pytest.approx(2.0, rel=0.05)
    # the prompt tokens took 0.04 s of every 0.49 s of steps that carried decodes
    assert s.interrupted(now) == pytest.approx(0.04 / 0.49, rel=0.1)
    assert s.interrupted(now + 5 * DECAY_S) < 0.01  # an idle engine: nobody is arriving
    alone = Throughput()
    alone.calibrate(CAL, now=0.0)
    alone.observe(0, 40, 0.05, now=0.05)  # one client: its prompt alone, then its decodes
    for k in range(1, 64):
        alone.observe(1, 0, 0.01, now=0.05 + 0.01 * k)
    assert alone.speed.interrupted(0.7) == 0.0  # its prompt held up no one


def test_a_run_is_forecast_with_the_prompts_that_come_after_it() -> None:
    """Fifteen running, one slot free: the new request starts now and runs 64 steps; at twice capacity every
    slot that frees meanwhile takes a new prompt. With a fifth of recent decode time taken by others' prompts,
    its run is forecast a quarter longer; the part of a run before the last known request starts is not
    stretched (its prompts are counted one by one)."""
    running = Load([Work(0, 64 - k * 4) for k in range(15)])
    calm, busy = SPEED, replace(SPEED, mixed=0.2)
    f0 = forecast(calm, running, SHAPE, 20, 64, Priority.INTERACTIVE)
    f1 = forecast(busy, running, SHAPE, 20, 64, Priority.INTERACTIVE)
    assert f0 is not None and f1 is not None
    assert f1.total_s == pytest.approx(f0.total_s * 1.25, rel=0.01)
    assert f1.idle_total_s == f0.idle_total_s  # an idle server has no one arriving
    full = Load([Work(0, 64) for _ in range(16)], [Work(20, 64)])  # it waits behind one queued request
    g0 = forecast(calm, full, SHAPE, 20, 64, Priority.INTERACTIVE)
    g1 = forecast(busy, full, SHAPE, 20, 64, Priority.INTERACTIVE)
    assert g0 is not None and g1 is not None
    assert g1.wait_s == g0.wait_s  # later prompts queue behind it: they come after its slot is free
    assert g1.total_s - g1.wait_s == pytest.approx((g0.total_s - g0.wait_s) * 1.25, rel=0.02)
