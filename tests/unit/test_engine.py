"""The engine thread on the reference backend: fidelity under batching, cancellation, limits, failures."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager

import pytest

from sluicegate.backends.base import BatchItem, Logits
from sluicegate.backends.reference import ReferenceRunner
from sluicegate.engine import (
    AsyncEngine,
    Engine,
    EngineOverloaded,
    EngineRequest,
    EngineStopped,
    FinishReason,
    RequestOutput,
    SamplingParams,
    SchedulerConfig,
)
from sluicegate.testing.wait import wait_for

_n = iter(range(1_000_000))


class Runner(ReferenceRunner):
    """The reference model, counting steps; optionally gated (each step waits for a permit) or failing."""

    def __init__(self, **kw: object) -> None:
        super().__init__(**kw)  # type: ignore[arg-type]
        self.gated = False
        self.permits = threading.Semaphore(0)
        self.steps = 0
        self.fail_next = False
        self.delay = 0.0  # seconds each step takes at least
        self.entered = 0  # steps that reached the runner (a gated one waits inside for its permit)
        self.batches: list[list[tuple[int, int, int]]] = []
        self.kv_ops: list[str] = []  # "clear", "truncate", "copy", in order

    def execute(self, batch: Sequence[BatchItem]) -> Logits:
        self.entered += 1
        if self.gated and not self.permits.acquire(timeout=20):
            raise AssertionError("the test never released this step")
        self.batches.append([(i.slot, i.start_pos, len(i.token_ids)) for i in batch])
        if self.fail_next:
            self.fail_next = False
            raise RuntimeError("boom")
        out = super().execute(batch)
        if self.delay:
            time.sleep(self.delay)
        self.steps += 1
        return out

    def clear(self, slot: int) -> None:
        self.kv_ops.append("clear")
        super().clear(slot)

    def truncate(self, slot: int, n_keep: int) -> None:
        self.kv_ops.append("truncate")
        super().truncate(slot, n_keep)

    def copy(self, src: int, dst: int) -> None:
        self.kv_ops.append("copy")
        super().copy(src, dst)

    def release(self, n: int = 1) -> None:
        for _ in range(n):
            self.permits.release()


class Collector:
    def __init__(self, clock: Callable[[], int] | None = None) -> None:
        self.outs: list[RequestOutput] = []
        self.done = threading.Event()
        self.clock = clock
        self.finished_at: int | None = None  # the clock when the final output arrived

    def __call__(self, out: RequestOutput) -> None:
        self.outs.append(out)
        if out.finished:
            self.finished_at = self.clock() if self.clock else None
            self.done.set()

    def wait(self, timeout: float = 20.0) -> RequestOutput:
        assert self.done.wait(timeout), "the request never finished"
        return self.outs[-1]

    @property
    def tokens(self) -> list[int]:
        return [t for o in self.outs for t in o.new_token_ids]

    @property
    def text(self) -> str:
        return "".join(o.text for o in self.outs)


def req(prompt: str | list[int], *, deadline: float | None = None, **params: object) -> EngineRequest:
    ids = [256, *prompt.encode()] if isinstance(prompt, str) else prompt
    return EngineRequest(f"r{next(_n)}", ids, SamplingParams(**params), deadline=deadline)  # type: ignore[arg-type]


@contextmanager
def engine(config: SchedulerConfig | None = None, **runner_kw: object) -> Iterator[tuple[Engine, Runner]]:
    runner = Runner(**{"n_slots": 4, "n_ctx": 512, "eos_slope": 0.0, **runner_kw})
    eng = Engine(runner, config or SchedulerConfig())
    eng.start()
    try:
        yield eng, runner
    finally:
        runner.gated = False
        runner.release(1000)
        eng.stop()


def run(eng: Engine, r: EngineRequest) -> Collector:
    runner = eng.runner
    c = Collector(lambda: runner.steps if isinstance(runner, Runner) else 0)
    eng.submit(r, c)
    return c


PROMPTS = [
    "The quick brown fox jumps over the lazy dog. " * 3,
    "The quick brown fox jumps over the lazy dog. " * 3 + "And then?",  # shares two blocks with the first
    "Hello",
    "x" * 200,
    "Numbers: 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13",
    "é漢字🙂 split characters",
]


def _variants() -> list[dict[str, object]]:
    out: list[dict[str, object]] = []
    for i, _ in enumerate(PROMPTS):
        out.append({"max_new_tokens": 20, "temperature": 0.0})
        out.append({"max_new_tokens": 20, "temperature": 0.9, "top_k": 20, "seed": 1000 + i})
        out.append({"max_new_tokens": 15, "temperature": 1.2, "top_p": 0.8, "seed": 7})
    return out


def test_batched_chunked_and_cached_runs_match_solo_runs() -> None:
    jobs = [(p, v) for p in PROMPTS for v in _variants()[:3]]
    solo = []
    for p, v in jobs:
        with engine(n_slots=1) as (eng, _):
            alone = run(eng, req(p, **v))
            alone.wait()
            solo.append(alone)
    # a tiny step budget forces chunked prefill; small blocks and four slots force reuse, copies and waits
    cfg = SchedulerConfig(max_batch_tokens=24, min_prefill_chunk=4, block_size=8)
    with engine(cfg) as (eng, runner):
        collectors = [run(eng, req(p, **v)) for p, v in jobs]
        finals = [c.wait() for c in collectors]
        assert eng.stats.prefix_hits > 0
        assert max(sum(n for _, _, n in b) for b in runner.batches) <= 24
    for (_, v), c, final, alone in zip(jobs, collectors, finals, solo, strict=True):
        assert c.tokens == alone.tokens and len(c.tokens) > 1
        assert c.text == alone.text
        assert final.finish_reason == alone.outs[-1].finish_reason
        if "seed" in v:
            assert final.seed == alone.outs[-1].seed == v["seed"]


def test_reused_prefix_is_reported_and_changes_nothing() -> None:
    prompt = "a long shared system prompt that fills several blocks. " * 4
    with engine(single_token_drift=0.05) as (eng, _):
        cold = run(eng, req(prompt, max_new_tokens=12, temperature=0.0))
        assert cold.wait().cached_tokens == 0
        warm = run(eng, req(prompt, max_new_tokens=12, temperature=0.0))
        n_prompt = len(prompt) + 1  # BOS
        assert warm.wait().cached_tokens == n_prompt - 2  # any prefix, to the token; two tokens left
        assert warm.tokens == cold.tokens
        # a follow-up turn repeats the answer, but only prompt tokens are reused: decoded tokens' KV is not
        # what a prefill of the same tokens computes (docs/engine.md; the runner's drift models it)
        follow = [256, *prompt.encode(), *cold.tokens, *b" and then?"]
        turn = run(eng, req(follow, max_new_tokens=8, temperature=0.0))
        assert turn.wait().cached_tokens == n_prompt
        assert eng.stats.cached_tokens == warm.wait().cached_tokens + turn.wait().cached_tokens
    with engine(single_token_drift=0.05) as (fresh, _):
        again = run(fresh, req(follow, max_new_tokens=8, temperature=0.0))
        again.wait()
        assert again.tokens == turn.tokens


@pytest.mark.parametrize("phase", ["queued", "prefill", "decode"])
def test_abort_reaches_the_engine_within_one_step_and_frees_the_slot(phase: str) -> None:
    cfg = SchedulerConfig(max_batch_tokens=16, min_prefill_chunk=4)
    with engine(cfg, n_slots=1) as (eng, runner):
        runner.gated = True
        blocker = None
        if phase == "queued":
            blocker = run(eng, req("block", max_new_tokens=400, ignore_eos=True))
            runner.release(3)
            wait_for(lambda: runner.steps == 3)
        victim = run(eng, req("v" * 300 if phase == "prefill" else "v", max_new_tokens=200, ignore_eos=True))
        runner.release(5)
        wait_for(lambda: runner.steps == (8 if phase == "queued" else 5))
        if phase == "prefill":
            assert not victim.outs  # still prefilling its 301 tokens, 16 per step
        if phase == "decode":
            wait_for(lambda: len(victim.tokens) >= 3)
        eng.abort(victim.outs[0].request_id if victim.outs else _last_id(eng))
        at_abort = runner.steps
        runner.gated = False
        runner.release(1000)
        final = victim.wait()
        assert final.finish_reason is FinishReason.CANCELLED
        assert victim.finished_at is not None
        assert victim.finished_at - at_abort <= 1  # the step in flight, then the abort lands before the next
        if blocker is not None:
            eng.abort(blocker.outs[0].request_id)
            blocker.wait()
        wait_for(lambda: not eng.scheduler.has_work)
        assert eng.scheduler.slots.n_busy == 0 and eng.stats.requests_cancelled >= 1
        assert eng.stats.snapshot()["running"] == 0


def _last_id(eng: Engine) -> str:
    seqs = [*eng.scheduler.running, *eng.scheduler.waiting]
    return max(seqs, key=lambda s: s.order).request.request_id


@pytest.mark.parametrize("phase", ["queued", "decode"])
def test_a_deadline_cancels_the_request(phase: str) -> None:
    with engine(n_slots=1) as (eng, runner):
        runner.delay = 0.002  # 400 tokens take at least 0.8 s
        if phase == "queued":
            blocker = run(eng, req("block", max_new_tokens=400, ignore_eos=True))
        victim = run(eng, req("v", max_new_tokens=400, ignore_eos=True, deadline=time.monotonic() + 0.05))
        final = victim.wait()
        assert final.finish_reason is FinishReason.EXPIRED and eng.stats.requests_expired == 1
        assert (final.completion_tokens == 0) == (phase == "queued")
        running = phase == "decode"
        assert eng.stats.requests_expired_running == int(running)
        assert (eng.stats.expired_tokens > 0) == running  # a queued one cost nothing
        if phase == "queued":
            eng.abort(_last_id(eng))
            blocker.wait()
        assert eng.stats.requests_in_deadline == 0 and eng.stats.goodput_tokens == 0
        done = run(eng, req("ok", max_new_tokens=3, ignore_eos=True, deadline=time.monotonic() + 3600)).wait()
        assert done.finish_reason is FinishReason.LENGTH
        assert eng.stats.requests_in_deadline == 1 and eng.stats.goodput_tokens == 3


def test_submit_refuses_by_the_deadline_forecast_once_calibrated() -> None:
    from sluicegate.engine import DeadlineTooShort
    from sluicegate.engine.forecast import Calibration

    with engine(n_slots=1) as (eng, runner):
        runner.gated = True
        blocker = run(eng, req("block", max_new_tokens=400, ignore_eos=True))  # (sampled: it could end early)
        wait_for(lambda: runner.entered >= 1)  # its load is published before its (held) forward pass
        # 10 ms a step, 1 ms a prompt token: the blocker's ~400 tokens are ~4 s ahead
        now = time.monotonic()
        eng._throughput.calibrate(Calibration(1, 0.01, 0.01, 0.001), now)
        with pytest.raises(DeadlineTooShort) as never:  # 200 tokens take 2 s even idle
            eng.submit(req("n", max_new_tokens=200, deadline=now + 0.5), Collector())
        assert never.value.judgement.needed_s > 0.5 and eng.stats.requests_shed == 0
        with pytest.raises(EngineOverloaded) as shed:  # fits idle (0.1 s), not behind 4 s of work
            eng.submit(req("s", max_new_tokens=10, deadline=now + 1.0), Collector())
        assert shed.value.code == "wait_exceeds_deadline" and 1 <= shed.value.retry_after <= 60
        assert eng.stats.requests_shed == 1
        ok = run(eng, req("ok", max_new_tokens=2, deadline=now + 3600, ignore_eos=True))  # fits: queued
        runner.gated = False
        runner.release(1000)
        assert ok.wait().finish_reason is FinishReason.LENGTH
        assert blocker.wait().finish_reason is FinishReason.LENGTH


def test_the_waiting_queue_is_bounded_and_refusals_say_when_to_retry() -> None:
    with engine(SchedulerConfig(max_waiting=2), n_slots=1) as (eng, runner):
        runner.gated = True
        first = run(eng, req("a", max_new_tokens=2))
        wait_for(lambda: eng.scheduler.slots.n_busy == 1)
        waiting = [run(eng, req("b", max_new_tokens=2)) for _ in range(2)]
        with pytest.raises(EngineOverloaded) as err:
            eng.submit(req("c", max_new_tokens=2), Collector())
        assert 1 <= err.value.retry_after <= 60 and eng.stats.requests_refused == 1
        runner.gated = False
        runner.release(1000)
        for c in (first, *waiting):
            assert c.wait().finish_reason is FinishReason.LENGTH


def test_the_token_bound_refuses_too_many_queued_prompt_tokens() -> None:
    with engine(SchedulerConfig(max_waiting_tokens=50), n_slots=1) as (eng, runner):
        runner.gated = True
        run(eng, req("x" * 40, max_new_tokens=2))  # in the inbox or waiting: 41 tokens
        with pytest.raises(EngineOverloaded):
            eng.submit(req("y" * 20, max_new_tokens=2), Collector())


def test_requests_the_window_cannot_hold_are_refused() -> None:
    with engine(n_ctx=64) as (eng, _):
        with pytest.raises(ValueError):
            eng.submit(req([], max_new_tokens=2), Collector())
        with pytest.raises(ValueError):
            eng.submit(req("x" * 60, max_new_tokens=10), Collector())


def test_stop_cancels_what_is_left_and_refuses_new_work() -> None:
    runner = Runner(n_slots=1, n_ctx=512, eos_slope=0.0)
    eng = Engine(runner, SchedulerConfig())
    eng.start()
    runner.gated = True
    running = run(eng, req("a", max_new_tokens=300, ignore_eos=True))
    wait_for(lambda: eng.scheduler.slots.n_busy == 1)
    queued = run(eng, req("b", max_new_tokens=5))
    stopper = threading.Thread(target=eng.stop, kwargs={"drain_s": 0.0})
    stopper.start()
    wait_for(lambda: not eng._accepting)
    with pytest.raises(EngineStopped):
        eng.submit(req("c"), Collector())
    runner.gated = False
    runner.release(1000)
    stopper.join(10)
    assert running.wait().finish_reason is FinishReason.CANCELLED
    assert queued.wait().finish_reason is FinishReason.CANCELLED


def test_a_failed_step_fails_its_requests_and_the_engine_goes_on() -> None:
    with engine(SchedulerConfig(block_size=4)) as (eng, runner):
        runner.gated = True
        a = run(eng, req("first request", max_new_tokens=5))
        b = run(eng, req("second request", max_new_tokens=5))
        wait_for(lambda: eng.scheduler.slots.n_busy == 2)
        runner.fail_next = True
        runner.gated = False
        runner.release(1000)
        for c in (a, b):
            final = c.wait()
            assert final.finish_reason is FinishReason.ERROR and final.error
        assert eng.stats.requests_failed == 2 and eng.scheduler.slots.cached_tokens == 0
        again = run(eng, req("first request", max_new_tokens=5)).wait()
        assert again.finish_reason is FinishReason.LENGTH and again.cached_tokens == 0


def test_a_failing_sink_loses_only_its_own_output() -> None:
    def bad(out: RequestOutput) -> None:
        raise RuntimeError("listener gone wrong")

    with engine() as (eng, _):
        eng.submit(req("a", max_new_tokens=3), bad)
        ok = run(eng, req("b", max_new_tokens=3)).wait()
        assert ok.finish_reason is FinishReason.LENGTH
        wait_for(lambda: eng.stats.requests_finished == 2)


def test_stop_strings_end_the_request_and_free_the_slot() -> None:
    with engine() as (eng, _):
        probe = run(eng, req("stop test", max_new_tokens=20, temperature=0.0))
        probe.wait()
        text = probe.text
        assert len(text) > 6
        stop = text[3:5]
        final = run(eng, req("stop test", max_new_tokens=20, temperature=0.0, stop=(stop,)))
        out = final.wait()
        assert out.finish_reason is FinishReason.STOP and final.text == text[: text.index(stop)]
        wait_for(lambda: eng.scheduler.slots.n_busy == 0)


def test_metrics_cover_latency_prefix_hits_and_kv_usage() -> None:
    with engine(SchedulerConfig(block_size=8)) as (eng, runner):
        runner.gated = True
        c = run(eng, req("y" * 40, max_new_tokens=30, ignore_eos=True))
        runner.release(3)
        wait_for(lambda: eng.stats.snapshot()["kv_tokens_used"] == 41 + 2)  # prompt, then two decode steps
        snap = eng.stats.snapshot()
        assert snap["running"] == 1 and runner.steps == 3
        assert 0 < snap["kv_usage"] < 1 and snap["kv_tokens_total"] == 4 * 512
        runner.gated = False
        runner.release(1000)
        c.wait()
        run(eng, req("y" * 40, max_new_tokens=3, ignore_eos=True)).wait()  # its 3 tokens, never an early end
        wait_for(lambda: eng.stats.snapshot()["kv_tokens_used"] == 0)  # the final reaches us before the slot frees
        snap = eng.stats.snapshot()
    model = {"model_name": runner.identity.name}
    value = eng.metrics.registry.get_sample_value
    for hist, count in (("time_to_first_token_seconds", 2), ("inter_token_latency_seconds", 29 + 2),
                        ("request_queue_time_seconds", 2), ("e2e_request_latency_seconds", 2),
                        ("request_prefill_time_seconds", 2), ("request_decode_time_seconds", 2),
                        ("step_seconds", runner.steps)):
        assert value(f"sluicegate_{hist}_count", model) == count, hist
        assert (value(f"sluicegate_{hist}_sum", model) or 0) > 0, hist
    assert value("sluicegate_requests_finished_total", {**model, "finish_reason": "length"}) == 2
    assert value("sluicegate_cached_tokens_total", model) == 32
    # 41 prompt tokens: reuse stops two tokens short of the end, at a block boundary
    assert snap["prefix_lookups"] == 2 and snap["prefix_hits"] == 1 and snap["cached_tokens"] == 32
    assert snap["generated_tokens"] == 33 and snap["requests_finished"] == 2 and snap["kv_tokens_used"] == 0
    assert snap["prefix_cached_tokens"] == 41  # the free slot holds the whole prompt again


def test_async_stream_aborts_when_the_consumer_leaves() -> None:
    async def main(eng: Engine) -> list[RequestOutput]:
        got: list[RequestOutput] = []
        async for out in AsyncEngine(eng).stream(req("s", max_new_tokens=400, ignore_eos=True)):
            got.append(out)
            if len(got) == 3:
                break
        return got

    with engine() as (eng, runner):
        # A real forward pass takes milliseconds and releases the GIL; the reference model's takes microseconds
        # and would let one thread generate all 400 tokens before the event loop reads three.
        runner.delay = 0.002
        got = asyncio.run(main(eng))
        assert len(got) == 3 and not got[-1].finished
        wait_for(lambda: eng.stats.requests_cancelled == 1 and not eng.scheduler.has_work)
        assert eng.stats.generated_tokens < 400


def test_a_burst_of_outputs_wakes_the_event_loop_once_and_loses_none() -> None:
    from sluicegate.engine.client import OutputCollector, _Mailbox

    async def main() -> None:
        loop = asyncio.get_running_loop()
        box = _Mailbox(loop)
        wakes: list[object] = []
        real = loop.call_soon_threadsafe

        def counting(cb: Callable[..., object], *args: object) -> asyncio.Handle:
            wakes.append(cb)
            return real(cb, *args)

        loop.call_soon_threadsafe = counting  # type: ignore[method-assign]
        collectors = [OutputCollector(1) for _ in range(16)]
        outs = [RequestOutput(f"r{i}", [i], str(i)) for i in range(16)]

        def burst() -> None:
            for c, o in zip(collectors, outs, strict=True):
                box.post(c, 0, o)

        t = threading.Thread(target=burst)
        t.start()
        t.join()  # the loop is blocked here, as it is while the engine finishes a step: one drain for all
        assert len(wakes) == 1
        assert [await asyncio.wait_for(c.get(), 1) for c in collectors] == [[(0, o)] for o in outs]
        box.post(collectors[0], 0, outs[0])  # after the drain, the next output wakes the loop again
        assert len(wakes) == 2
        assert await asyncio.wait_for(collectors[0].get(), 1) == [(0, outs[0])]

    asyncio.run(main())


def test_a_lagging_consumer_gets_merged_deltas_not_a_growing_queue() -> None:
    from sluicegate.engine.client import OutputCollector
    from sluicegate.engine.types import Timing, TokenLogprob

    async def main() -> None:
        c = OutputCollector(2)
        c.put(0, RequestOutput("a", [1], "x", logprobs=[TokenLogprob(1, -0.5)]))
        c.put(1, RequestOutput("b", [7], "q"))
        c.put(0, RequestOutput("a", [2, 3], "yz", logprobs=[TokenLogprob(2, -0.1)]))
        timing = Timing(1.0, 2.0, 3.0, 6.0)
        c.put(0, RequestOutput("a", [], "!", finished=True, finish_reason=FinishReason.LENGTH, prompt_tokens=4,
                               completion_tokens=3, seed=9, timing=timing))
        got = await asyncio.wait_for(c.get(), 1)
        assert [i for i, _ in got] == [0, 1]  # the order runs first produced output in
        a = got[0][1]
        assert a.new_token_ids == [1, 2, 3] and a.text == "xyz!" and [lp.token_id for lp in a.logprobs] == [1, 2]
        assert a.finished and a.finish_reason is FinishReason.LENGTH and a.completion_tokens == 3
        assert a.prompt_tokens == 4 and a.seed == 9 and a.timing == timing
        assert got[1][1].text == "q" and not got[1][1].finished
        assert await c.get(timeout=0.01) == []  # silence: an empty batch, the heartbeat's cue

    asyncio.run(main())


def test_a_failing_admission_ends_the_request_instead_of_losing_it() -> None:
    """A bug while admitting one request fails that request (typed error output); the rest are served."""
    with engine() as (eng, _):
        real = eng._admit
        calls = iter(range(1000))

        def flaky(request: EngineRequest, sink: Callable[[RequestOutput], None]) -> None:
            if next(calls) == 1:
                raise RuntimeError("injected")
            real(request, sink)

        eng._admit = flaky  # type: ignore[method-assign]
        with eng._lock:  # all three in one inbox, taken together by the engine thread
            cs = [Collector() for _ in range(3)]
            for i, c in enumerate(cs):
                eng._inbox.append((req(f"p{i}", max_new_tokens=2), c))
            eng._lock.notify()
        finals = [c.wait() for c in cs]
        assert [f.finish_reason for f in finals] == [FinishReason.LENGTH, FinishReason.ERROR, FinishReason.LENGTH]
        assert finals[1].error


def test_a_failing_cancellation_still_ends_the_request() -> None:
    with engine() as (eng, runner):
        runner.delay = 0.002
        victim = run(eng, req("v", max_new_tokens=400, ignore_eos=True))
        wait_for(lambda: len(victim.tokens) >= 1)

        def broken(request_id: str) -> None:
            raise RuntimeError("injected")

        eng._cancel = broken  # type: ignore[method-assign]
        eng.abort(victim.outs[0].request_id)
        assert victim.wait().finish_reason is FinishReason.ERROR
        wait_for(lambda: not eng.scheduler.has_work)


def test_a_failing_step_fails_its_requests_and_the_engine_keeps_serving() -> None:
    with engine() as (eng, runner):
        runner.fail_next = True
        failed = run(eng, req("f", max_new_tokens=3)).wait()
        assert failed.finish_reason is FinishReason.ERROR
        assert run(eng, req("ok", max_new_tokens=3)).wait().finish_reason is FinishReason.LENGTH


def test_stop_reports_whether_the_thread_ended_and_close_never_frees_a_running_model() -> None:
    runner = Runner(n_slots=1, n_ctx=512, eos_slope=0.0)
    eng = Engine(runner, SchedulerConfig())
    eng.start()
    runner.gated = True
    c = run(eng, req("x", max_new_tokens=50, ignore_eos=True))
    wait_for(lambda: runner.entered >= 1)  # a step is inside the runner, waiting for its permit
    assert eng.stop(join_s=0.05) is False
    closed: list[bool] = []
    runner.close = lambda: closed.append(True)  # type: ignore[method-assign]
    eng.close()
    assert closed == []  # the thread may still be in the forward pass: the model stays
    runner.gated = False
    runner.release(1000)
    assert c.wait().finish_reason is FinishReason.CANCELLED
    assert eng.stop() is True
    eng.close()
    assert closed == [True]


class ThreadRecorder(Runner):
    """Records the thread each forward pass ran on (llama.cpp keeps a worker pool per computing thread)."""

    def __init__(self, **kw: object) -> None:
        super().__init__(**kw)
        self.threads: set[str] = set()
        self.fail_calibration = False

    def execute(self, batch: Sequence[BatchItem]) -> Logits:
        self.threads.add(threading.current_thread().name)
        if self.fail_calibration:
            raise RuntimeError("the backend failed")
        return super().execute(batch)


def test_start_calibrates_on_the_engine_thread_then_serves_there() -> None:
    runner = ThreadRecorder(n_slots=4, n_ctx=512, eos_slope=0.0)
    eng = Engine(runner, SchedulerConfig())
    try:
        eng.start(calibrate=True)
        assert eng.speed.measured  # start returned after the measurement
        assert runner.threads == {"sluicegate-engine"}
        out = run(eng, req("hello", max_new_tokens=3, ignore_eos=True)).wait()
        assert out.finish_reason is FinishReason.LENGTH
        assert runner.threads == {"sluicegate-engine"}
    finally:
        eng.stop()


def test_a_failed_calibration_is_raised_by_start_and_ends_the_thread() -> None:
    runner = ThreadRecorder(n_slots=4, n_ctx=512, eos_slope=0.0)
    runner.fail_calibration = True
    eng = Engine(runner, SchedulerConfig())
    with pytest.raises(RuntimeError, match="the backend failed"):
        eng.start(calibrate=True)
    assert eng._thread is not None and not eng._thread.is_alive()
    assert not eng.speed.measured
