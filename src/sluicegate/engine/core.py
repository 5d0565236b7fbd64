"""The engine loop: one thread that owns the runner and steps the scheduler.

    out = scheduler.schedule(now); logits = runner.execute(out); scheduler.update(out, sample(logits))

Other threads talk to it only through `submit` and `abort` (a locked inbox); results leave through each
request's sink, called on the engine thread. The event loop never waits on a forward pass.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import CollectorRegistry

from sluicegate.backends.base import BatchItem, LoadedModel, ModelRunner
from sluicegate.engine.admission import DeadlineAdmission, forecast_errors
from sluicegate.engine.calibrate import measure
from sluicegate.engine.detokenizer import IncrementalDetokenizer, StopMatcher
from sluicegate.engine.forecast import Calibration, DeadlineTooShort, Load, Shape, Speed, Verdict, load_of, work_of
from sluicegate.engine.kv_tier import KvTier, default_budget
from sluicegate.engine.metrics import EngineMetrics
from sluicegate.engine.sampler import SampleRow, sample
from sluicegate.engine.scheduler import (
    Scheduler,
    SchedulerConfig,
    SchedulerOutput,
    Seq,
    SeqStatus,
    queue_has_room,
)
from sluicegate.engine.speculative import settle
from sluicegate.engine.stats import EngineStats
from sluicegate.engine.types import EngineRequest, FinishReason, RequestOutput, Timing, TokenLogprob

log = logging.getLogger("sluicegate.engine")

_FAILED = "the engine failed while running this request"

Sink = Callable[[RequestOutput], None]


class EngineOverloaded(Exception):
    """Not now: the waiting queue is full (`code` "queue_full"), or the forecast says the request cannot meet
    its deadline at the present load ("wait_exceeds_deadline"); retry after `retry_after` seconds."""

    def __init__(self, retry_after: int, message: str, code: str = "queue_full") -> None:
        super().__init__(message)
        self.retry_after = retry_after
        self.code = code


class EngineStopped(Exception):
    """The engine is shutting down and takes no new work."""


@dataclass(slots=True)
class _Live:
    """Per-request output state kept beside the scheduler's Seq."""

    seq: Seq
    sink: Sink
    detok: IncrementalDetokenizer
    stop: StopMatcher
    last_emit: float = 0.0
    n_emitted: int = 0  # tokens streamed so far
    logprobs: list[TokenLogprob] = field(default_factory=list)


class Engine:
    def __init__(
        self, runner: ModelRunner, config: SchedulerConfig | None = None, *, registry: CollectorRegistry | None = None,
        compute: threading.Lock | None = None,
    ) -> None:
        """`compute`: a lock every forward pass holds, shared by the engines of the models one process serves, so
        their steps take turns on the cores instead of colliding at llama.cpp's thread barriers."""
        self.runner = runner
        self._compute: contextlib.AbstractContextManager[Any] = (
            compute if compute is not None else contextlib.nullcontext())
        limits = runner.limits
        cfg = config or SchedulerConfig()
        if cfg.max_batch_tokens > limits.n_batch:
            cfg = dataclasses.replace(cfg, max_batch_tokens=limits.n_batch)
        self.kv_tier = KvTier(default_budget() if cfg.kv_cache_bytes is None else cfg.kv_cache_bytes)
        self.scheduler = Scheduler(cfg, limits.n_slots, limits.eos_ids, exact_replies=limits.decoded_kv_exact,
                                   exact_drafts=limits.drafts_exact, max_drafts=limits.max_drafts,
                                   kv_tier=self.kv_tier)
        self.stats = EngineStats(slots_total=limits.n_slots, kv_tokens_total=limits.n_slots * limits.n_ctx)
        self.metrics = EngineMetrics(self.stats, runner.identity.name, registry)
        self._lock = threading.Condition()
        self._inbox: list[tuple[EngineRequest, Sink]] = []
        self._inbox_tokens = 0
        # The waiting queue as admission sees it, published by the engine thread under the lock (submit
        # must not read the scheduler's lists, which the engine thread changes without it): requests taken
        # from the inbox and not yet published count as waiting until the next publish.
        self._waiting_n = 0
        self._waiting_tokens = 0
        self._load = Load()  # the same for deadline admission: published load, plus the inbox taken since
        self._inbox_load = Load()  # what the inbox holds
        self._admission = DeadlineAdmission(limits.n_slots)  # deadline admission's state (engine/admission.py)
        self._throughput = self._admission.throughput  # calibrated at load (`calibrate`), corrected every step
        self._aborts: set[str] = set()
        self._live: dict[str, _Live] = {}
        self._accepting = True
        self._stopping = False
        self._thread: threading.Thread | None = None

    def _earn_invariance(self) -> None:
        """A runner that asks for it is probed (backends/invariance.py) before anything is served; what did not
        hold is withdrawn from the runner's limits and from what the scheduler reuses (decoded KV, drafts)."""
        if isinstance(self.runner, LoadedModel) and self.runner.probe_at_load and self.runner.invariance is None:
            with self._compute:
                found = self.runner.earn_invariance()
            self.scheduler.withdraw(replies=found.decoded, drafts=found.drafts)

    # -- any thread --------------------------------------------------------------------------------------
    def start(self, *, calibrate: bool = False) -> None:
        """Start the engine thread: it first probes the runner's numerics when the runner asks
        (`_earn_invariance`), and with `calibrate` measures the step model (`calibrate`); this returns once both
        are done (re-raising what they raised: then the thread has ended).

        The measurement runs on the engine thread because llama.cpp's steps are only as fast there as anywhere
        if no other thread ever computed: GNU OpenMP keeps a pool of workers per thread that ran a parallel
        region, and once more threads are kept than the machine has cores it throttles their spinning at
        every barrier. A calibration taken on another thread (a worker of `asyncio.to_thread`) made every later
        step of 7 sequences 37 -> 50 ms and of 16 68 -> 86 ms here (the forecast 1.35x short, a cold burst's
        admitted requests late by as much), one sequence unchanged (bench output in docs/benchmarks.md,
        "Overload")."""
        done = threading.Event()
        failed: list[BaseException] = []

        def run() -> None:
            try:
                self._earn_invariance()  # the runner's numerics, measured (when it asks) before the step model
                if calibrate:
                    self.calibrate()
            except BaseException as exc:  # handed to the caller, who fails the load
                failed.append(exc)
                return
            finally:
                done.set()
            self._loop()

        self._thread = threading.Thread(target=run, name="sluicegate-engine", daemon=True)
        self._thread.start()
        done.wait()
        if failed:
            self._thread.join()
            raise failed[0]

    def submit(self, request: EngineRequest, sink: Sink) -> None:
        """Queue a request, or refuse it at once: `EngineOverloaded` when the waiting queue is full,
        `EngineStopped` while shutting down, `ValueError` for a request the window cannot hold."""
        n_prompt = len(request.prompt_ids)
        n_ctx = self.runner.limits.n_ctx
        if n_prompt == 0 or n_prompt + request.params.max_new_tokens > n_ctx:
            n_new = request.params.max_new_tokens
            raise ValueError(f"{n_prompt} prompt + {n_new} new tokens do not fit a window of {n_ctx}")
        with self._lock:
            if not self._accepting:
                raise EngineStopped("the server is shutting down")
            waiting = len(self._inbox) + self._waiting_n
            tokens = self._inbox_tokens + self._waiting_tokens
            if not queue_has_room(self.scheduler.config, waiting, tokens, n_prompt):
                with self.stats.lock:
                    self.stats.requests_refused += 1
                raise EngineOverloaded(
                    self._retry_after(waiting),
                    f"{waiting} requests are waiting; the queue holds {self.scheduler.config.max_waiting}",
                )
            cached = self._admit_by_deadline(request)
            self._inbox.append((request, sink))
            self._inbox_tokens += n_prompt
            self._inbox_load.waiting.append(work_of(request, n_prompt - cached))
            self._lock.notify()

    @property
    def speed(self) -> Speed:
        """The measured speed deadline admission forecasts with (engine/forecast.py)."""
        return self._throughput.speed

    def calibrate(self, repeats: int = 6) -> Calibration:
        """Measure the step model deadline admission forecasts with (engine/calibrate.py) and start correcting
        it from there. `start(calibrate=True)` calls it on the engine thread, which the server does (`start` says
        why); called directly, call it before `start` (the engine thread owns the runner after)."""
        with self._compute:  # another model's steps wait (a second or so): neither measures the other's barriers
            c = measure(self.runner, repeats)
        self._throughput.calibrate(c, time.monotonic())
        log.info("calibrated the step time: %.1f ms at one sequence, %.1f ms at %d; %.2f ms a prompt token",
                 c.step_1 * 1e3, c.step_n * 1e3, c.n_slots, c.token_s * 1e3)
        return c

    def _admit_by_deadline(self, request: EngineRequest) -> int:
        """Refuse (under the lock) a request the forecast says cannot meet its deadlines, or would push an
        admitted one past its own (engine/forecast.py); keep the forecast of one admitted (its error). Returns
        the prompt tokens it is expected to take from the prefix cache (engine/reuse.py)."""
        if not self.scheduler.config.deadline_admission:
            return 0
        load = self._load.copy().merge(self._inbox_load)
        shape = Shape(self.runner.limits.n_slots, self.scheduler.config.max_batch_tokens)
        j, cached = self._admission.judge(request, load, shape, time.monotonic())
        if j.verdict is Verdict.NEVER:
            raise DeadlineTooShort(j)
        if j.verdict is Verdict.SHED:
            with self.stats.lock:
                self.stats.requests_shed += 1
            raise EngineOverloaded(j.retry_after, j.describe(), code="wait_exceeds_deadline")
        return cached

    def abort(self, request_id: str) -> None:
        with self._lock:
            self._aborts.add(request_id)
            self._lock.notify()

    def stop(self, *, drain_s: float = 0.0, join_s: float = 30.0) -> bool:
        """Refuse new work; let running work finish for up to `drain_s`, then cancel the rest.

        Returns whether the engine thread has ended (it may still be inside a forward pass after `join_s`);
        only then may the runner be freed (`close`).
        """
        with self._lock:
            self._accepting = False
        deadline = time.monotonic() + drain_s
        while time.monotonic() < deadline and self._busy():
            time.sleep(0.01)
        with self._lock:
            self._stopping = True
            self._lock.notify()
        if self._thread is not None:
            self._thread.join(timeout=join_s)
            return not self._thread.is_alive()
        return True

    @property
    def idle(self) -> bool:
        """Nothing queued, nothing running: the model may be unloaded (api/local_models.py)."""
        return not self._busy()

    def _busy(self) -> bool:
        with self._lock:
            queued = bool(self._inbox or self._waiting_n)
        with self.stats.lock:
            return queued or self.stats.running > 0

    def close(self) -> None:
        """Free the runner, unless the engine thread may still use it (then it is left to the process exit)."""
        if self._thread is not None and self._thread.is_alive():
            log.warning("the engine thread is still in a step; the model is not freed")
            return
        self.metrics.detach()  # its samples leave /metrics with it (a model unloaded: api/local_models.py)
        self.runner.close()

    def _retry_after(self, waiting: int) -> int:
        rate = self.stats.drain_rate()
        if rate <= 0:
            return 5
        return max(1, min(60, math.ceil(waiting / rate)))

    # -- engine thread -----------------------------------------------------------------------------------
    def _loop(self) -> None:
        while True:
            with self._lock:
                while not (self._stopping or self._inbox or self._aborts or self.scheduler.has_work):
                    self._lock.wait()
                if self._stopping:
                    break
                inbox, self._inbox = self._inbox, []
                self._waiting_n += len(inbox)
                self._waiting_tokens += self._inbox_tokens
                self._inbox_tokens = 0
                self._load.merge(self._inbox_load)
                self._inbox_load = Load()
                aborts, self._aborts = self._aborts, set()
            try:
                self._take(inbox, aborts)
                if self.scheduler.has_work:
                    self.step()
                else:
                    self._update_gauges()  # cancellations can empty the engine between steps
            except Exception:  # a bug, not a model failure (step() handles those): fail loudly, keep serving
                log.exception("engine loop error; failing every request in flight")
                self._fail_all(_FAILED)
                self._update_gauges()
        with self._lock:
            inbox, self._inbox, self._inbox_tokens = self._inbox, [], 0
        self._take(inbox, set())  # submitted just before shutdown: admitted only to be cancelled
        now = time.monotonic()
        for live in list(self._live.values()):
            self.scheduler.finish(live.seq, FinishReason.CANCELLED, now)
            self._finish(live, FinishReason.CANCELLED, now)
        self._update_gauges()

    def _take(self, inbox: list[tuple[EngineRequest, Sink]], aborts: set[str]) -> None:
        """Admit the inbox and apply the aborts; a request that fails either way ends with an error output
        instead of being lost (its client would wait forever)."""
        for request, sink in inbox:
            try:
                self._admit(request, sink)
            except Exception:
                log.exception("could not admit %s", request.request_id)
                self._live.pop(request.request_id, None)
                with self._lock:
                    self._admission.forget(request.request_id)
                seq = self.scheduler.find(request.request_id)
                if seq is not None:
                    self.scheduler.finish(seq, FinishReason.ERROR, time.monotonic())
                _deliver_to(sink, RequestOutput(
                    request.request_id, [], "", finished=True, finish_reason=FinishReason.ERROR, error=_FAILED,
                ))
        for request_id in aborts:
            try:
                self._cancel(request_id)
            except Exception:
                log.exception("could not cancel %s", request_id)
                live = self._live.get(request_id)
                if live is not None:
                    self._fail_seq(live.seq, time.monotonic())

    def _admit(self, request: EngineRequest, sink: Sink) -> None:
        seed = request.params.seed if request.params.seed is not None else secrets.randbits(63)
        seq = Seq(request=request, seed=seed)
        tb = self.runner.token_bytes
        stop = StopMatcher(request.params.stop)
        live = _Live(seq, sink, IncrementalDetokenizer(tb), stop)
        self.scheduler.add(seq)
        self._live[request.request_id] = live

    def _cancel(self, request_id: str) -> None:
        live = self._live.get(request_id)
        if live is not None:
            now = time.monotonic()
            seq = live.seq
            log.debug("cancelled %s (%s, %d tokens out)", request_id, seq.status.value, len(seq.output_ids))
            self.scheduler.finish(seq, FinishReason.CANCELLED, now)
            self._finish(live, FinishReason.CANCELLED, now)

    def step(self) -> None:
        now = time.monotonic()
        out = self.scheduler.schedule(now)
        self._publish_waiting()  # before the forward pass: the requests just scheduled no longer wait
        for seq in out.expired:
            self._count_expired(seq)
            self._finish(self._live[seq.request.request_id], FinishReason.EXPIRED, now)
        if out.empty and not out.kv_ops:
            self._update_gauges()
            return
        try:
            self._apply_kv_ops(out)
            began = time.monotonic()
            sampled = self._forward(out) if out.chunks else ([], {})
            done = time.monotonic()
            drafting = self.scheduler.drafting
            if drafting is not None and out.chunks:
                decode_only = all(c.start_pos >= c.seq.prompt_len for c in out.chunks)
                drafting.observe_step(sum(len(c.token_ids) for c in out.chunks) if decode_only else 0, done - began)
            results = self.scheduler.update(out, sampled[0], done)
            if any(c.n_draft for c in out.chunks):
                self._settle_drafts(out, sampled[0])
            decoding = [c for c in out.chunks if c.start_pos >= c.seq.prompt_len]
            self._throughput.observe(len(decoding), sum(len(c.token_ids) for c in out.chunks) - len(decoding),
                                     done - now, done)
            with self.stats.lock:
                self.stats.steps += 1
                self.stats.prompt_tokens += sum(
                    len(c.token_ids) for c in out.chunks if c.start_pos < c.seq.prompt_len
                )
            self.metrics.step.observe(done - now)
            for i, (seq, token) in enumerate(results):
                last = i + 1 == len(results) or results[i + 1][0] is not seq
                self._emit_token(seq, token, sampled[1].get(id(seq)), done, last=last)
        except Exception:
            log.exception("engine step failed; failing the %d sequences in it", len(out.chunks))
            self._fail(out)
        self._update_gauges()

    def _apply_kv_ops(self, out: SchedulerOutput) -> None:
        for op in out.kv_ops:
            if op.kind == "clear":
                self.runner.clear(op.slot)
            elif op.kind == "truncate":
                self.runner.truncate(op.slot, op.arg)
            elif op.kind == "copy":  # with the tier's saves and restores about, copies must land in op order
                (self.runner.clone if self.kv_tier.enabled else self.runner.copy)(op.arg, op.slot)
            elif op.kind == "save":
                self.kv_tier.put(op.tokens, self.runner.save(op.slot, op.arg))
            else:
                began = time.monotonic()
                self.runner.restore(op.slot, op.snapshot)
                self.metrics.kv_restore.observe(time.monotonic() - began)

    def _forward(self, out: SchedulerOutput) -> tuple[list[int], dict[int, TokenLogprob]]:
        items = [BatchItem(c.seq.slot or 0, c.token_ids, c.start_pos, c.want_logits, logits_all=c.n_draft > 0,
                           prompt=c.start_pos < c.seq.prompt_len) for c in out.chunks]
        with self._compute:
            logits = self.runner.execute(items)
        rows = [
            SampleRow(c.seq.request.params, c.seq.seed, len(c.seq.output_ids), c.seq.output_ids,
                      c.seq.request.constraint)
            if not c.n_draft else
            SampleRow(c.seq.request.params, c.seq.seed, len(c.seq.output_ids) + j,
                      [*c.seq.output_ids, *c.token_ids[1 : 1 + j]])
            for c in out.chunks if c.want_logits for j in range(1 + c.n_draft)
        ]
        tokens, lps = sample(logits, rows)
        wanting = [c.seq for c in out.chunks if c.want_logits for _ in range(1 + c.n_draft)]
        return tokens, {id(s): lp for s, lp in zip(wanting, lps, strict=True) if lp is not None}

    def _settle_drafts(self, out: SchedulerOutput, sampled: list[int]) -> int:
        """Drop rejected drafts' KV and count them (engine/speculative.py); returns the drafts accepted."""
        drafted, agreed = settle(out.chunks, sampled, self.runner)
        with self.stats.lock:
            self.stats.spec_draft_tokens += drafted
            self.stats.spec_accepted_tokens += agreed
        return agreed

    def _emit_token(
        self, seq: Seq, token: int, logprob: TokenLogprob | None, now: float, *, last: bool = True,
    ) -> None:
        """Stream one token. `last`: the sequence's last token of this step (a speculative step keeps several;
        the scheduler may have finished the sequence at the last one, which earlier ones must not report)."""
        live = self._live.get(seq.request.request_id)
        if live is None:
            return
        live.n_emitted += 1
        constraint = seq.request.constraint
        if constraint is not None and token not in self.scheduler.eos_ids:
            constraint.accept(token)
        with self.stats.lock:
            self.stats.generated_tokens += 1
        if len(seq.output_ids) == 1 and seq.first_scheduled is not None:
            self.metrics.ttft.observe(now - seq.request.arrival)
        elif live.last_emit:
            self.metrics.itl.observe(now - live.last_emit)
        live.last_emit = now
        if logprob is not None:
            live.logprobs.append(logprob)
        is_eos = token in self.scheduler.eos_ids and not seq.request.params.ignore_eos
        text = live.stop.feed("" if is_eos else live.detok.push(token))
        if live.stop.matched is not None:
            self.scheduler.finish(seq, FinishReason.STOP, now)
            if not last:  # accepted drafts past the stop string are not output (the scheduler counted them)
                del seq.output_ids[live.n_emitted :]
                seq.finish_reason = FinishReason.STOP
        elif not last:
            lps, live.logprobs = live.logprobs, []
            _deliver(live, RequestOutput(seq.request.request_id, [token], text, logprobs=lps))
            return
        if seq.finish_reason is not None:
            if live.stop.matched is None:
                text += live.stop.feed(live.detok.flush()) + live.stop.flush()
            self._finish(live, seq.finish_reason, now, text=text, new_ids=[token])
            return
        lps, live.logprobs = live.logprobs, []
        _deliver(live, RequestOutput(seq.request.request_id, [token], text, logprobs=lps))

    def _finish(
        self, live: _Live, reason: FinishReason, now: float, *, text: str = "",
        new_ids: list[int] | None = None, error: str | None = None,
    ) -> None:
        seq = live.seq
        self._live.pop(seq.request.request_id, None)
        arrival = seq.request.arrival
        start = seq.first_scheduled or now
        first = seq.first_token or now
        timing = Timing(
            queue_ms=(start - arrival) * 1e3, prefill_ms=(first - start) * 1e3,
            decode_ms=(now - first) * 1e3, total_ms=(now - arrival) * 1e3,
        )
        m = self.metrics
        m.e2e.observe(now - arrival)
        m.queue.observe(start - arrival)
        if seq.first_token is not None:
            m.prefill.observe(first - start)
            m.decode.observe(now - first)
        m.finished(reason.value)
        self._forecast_error(seq, reason, now)
        with self.stats.lock:
            self.stats.requests_finished += 1
            self.stats.cached_tokens += seq.cached_tokens
            self.stats.finish_times.append(now)
            if reason in (FinishReason.CANCELLED, FinishReason.EXPIRED):
                self.stats.requests_cancelled += 1
            elif reason is not FinishReason.ERROR and (seq.request.deadline is None or now <= seq.request.deadline):
                self.stats.requests_in_deadline += 1
                self.stats.goodput_tokens += len(seq.output_ids)
            elif reason is FinishReason.ERROR:
                self.stats.requests_failed += 1
        _deliver(
            live,
            RequestOutput(
                seq.request.request_id, new_ids or [], text, finished=True, finish_reason=reason,
                stop_string=live.stop.matched if reason is FinishReason.STOP else None, logprobs=live.logprobs,
                prompt_tokens=seq.prompt_len, cached_tokens=seq.cached_tokens,
                completion_tokens=len(seq.output_ids), seed=seq.seed, timing=timing, error=error,
            ),
        )

    def _forecast_error(self, seq: Seq, reason: FinishReason, now: float) -> None:
        """Observe forecast / actual for a run that ended normally, the forecast taken at the tokens it made."""
        with self._lock:
            kept = self._admission.forget(seq.request.request_id)
        errors = forecast_errors(kept, seq.request, len(seq.output_ids), reason, now)
        if errors is not None:
            self.metrics.forecast_error.observe(errors[0])
            self.metrics.admission_forecast_error.observe(errors[1])

    def _fail(self, out: SchedulerOutput) -> None:
        """Fail the step's sequences: their KV may be half-written, so their slots are cleared, cache too."""
        now = time.monotonic()
        for seq in dict.fromkeys(c.seq for c in out.chunks):
            self._fail_seq(seq, now)

    def _fail_all(self, message: str) -> None:
        now = time.monotonic()
        for live in list(self._live.values()):
            self._fail_seq(live.seq, now, message)

    def _fail_seq(self, seq: Seq, now: float, message: str = _FAILED) -> None:
        if seq.status is SeqStatus.FINISHED and seq.request.request_id not in self._live:
            return  # finished normally within the step; its output was delivered and its KV is whole
        slot = seq.slot if seq.status is SeqStatus.RUNNING else None
        self.scheduler.finish(seq, FinishReason.ERROR, now)
        if slot is not None:
            try:
                self.runner.clear(slot)
            except Exception:
                log.exception("could not clear slot %d", slot)
        live = self._live.get(seq.request.request_id)
        if live is not None:
            self._finish(live, FinishReason.ERROR, now, error=message)

    def _count_expired(self, seq: Seq) -> None:
        """A deadline ended `seq`: queued (it never had a slot: no compute spent) or running (its work is lost)."""
        with self.stats.lock:
            self.stats.requests_expired += 1
            if seq.first_scheduled is not None:
                self.stats.requests_expired_running += 1
                computed = min(seq.num_computed, seq.prompt_len) - seq.cached_tokens
                self.stats.expired_tokens += computed + len(seq.output_ids)

    def _publish_waiting(self) -> None:
        """What admission sees (submit): the scheduler's queue, which now holds the inbox taken before."""
        load = load_of(self.scheduler.running, self.scheduler.waiting, self._admission.recent.expected)
        with self._lock:
            self._waiting_n = len(self.scheduler.waiting)
            self._waiting_tokens = self.scheduler.waiting_tokens
            self._load = load

    def _update_gauges(self) -> None:
        slots = self.scheduler.slots
        self._publish_waiting()
        with self.stats.lock:
            self.stats.running = len(self.scheduler.running)
            self.stats.waiting = len(self.scheduler.waiting)
            self.stats.slots_busy = slots.n_busy
            self.stats.kv_tokens_used = self.scheduler.kv_tokens_used
            self.stats.prefix_lookups = slots.lookups
            self.stats.prefix_hits = slots.hits
            self.stats.prefix_evicted_tokens = slots.evictions
            self.stats.prefix_cached_tokens = slots.cached_tokens
            self.stats.kv_tier_hits = slots.tier_hits
            self.stats.kv_tier_restored_tokens = slots.restored_tokens
            self.stats.kv_tier_saves = self.kv_tier.saves
            self.stats.kv_tier_bytes = self.kv_tier.bytes_held
            self.stats.kv_tier_entries = len(self.kv_tier)
            self.stats.drain_tokens_per_second = self._throughput.speed.rate(time.monotonic())
            if self.scheduler.drafting is not None:
                self.stats.spec_row_cost = self.scheduler.drafting.cost


def _deliver(live: _Live, out: RequestOutput) -> None:
    _deliver_to(live.sink, out)


def _deliver_to(sink: Sink, out: RequestOutput) -> None:
    """Hand an output to its sink; a failing sink loses its own output, never the engine."""
    try:
        sink(out)
    except Exception:
        log.exception("the sink of %s failed", out.request_id)
