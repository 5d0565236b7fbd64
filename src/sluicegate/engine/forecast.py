"""Deadline admission: whether a new request can finish inside its deadline, without pushing the requests
already admitted past theirs (docs/timeouts.md, "Deadline admission").

The model of a step, **calibrated while the model loads** (`Engine.calibrate`, before `/readyz` says ready):

    step(b)       = linear between decode steps measured at b = 1, 2, 4, ... and n sequences
    cost(b, p)    = step(max(b, 1)) + p * token_s                      a step that also prefills p prompt tokens

`step_1` and `step_n` are decode steps measured at one sequence and at the full slot count `n`, `between` at the
powers of two between (engine/calibrate.py); `token_s` is what each prompt token of a full chunk adds. On a CPU
a decode step's cost grows with the sequences it carries (one pass over the weights, plus each sequence's own
work): 16 sequences took ~9x one here, so the batch a request would join matters as much as the queue ahead of
it; and it grows most at the second sequence (`Calibration.step`).

The calibration is corrected by what every step measures (`Throughput.observe`): `scale`, a moving average of
log(measured / modelled), kept at one sequence and at every slot (log-linear in between; least mean squares
shares each step's error between the ends), in which every step weighs `ALPHA`, however long it took (a slow
first prefill is one step among others, not most of the average), each step's ratio clamped to
[1/`MAX_RATIO`, `MAX_RATIO`] (one step stalled by the operating system moves it by a bounded amount). With no
step for a while the correction decays back towards the calibration (time constant `DECAY_S`), or the long-run
correction where that is faster: an engine that refuses everything on a wrong estimate measures nothing, so its
estimate must come back on its own, and does within seconds. And an empty engine admits a refused request now
and then as a probe (`judge(probe=...)`, `PROBE_S`), whose steps correct a calibration that was too slow.

A request's forecast (`plan`): the engine as a list of slots, each free when the running sequence in it ends;
the requests waiting ahead of it (every one of its priority or higher: they are scheduled first) take the
earliest free slot in turn, then it does. Everyone is timed at the step of the batch the engine will hold,
`b = min(n, running + waiting + 1)`:

    duration      = ceil(prompt / chunk) * step(b) + prompt * token_s + (new - 1) * step(b)
    first token   = start + ceil(prompt / chunk) * step(b) + prompt * token_s
    idle          = the same on an empty engine at the calibration (b = 1, no correction above 1)

times `scale`. A request is admitted (`judge`) only when

- its own forecast, with the headroom added (`HEADROOM`, 10%, once recent steps confirm the estimate; up to
  `COLD_HEADROOM`, 50%, while none has: `Speed.headroom`), fits the time left before each of its deadlines (SHED: 503,
  Retry-After); its idle forecast must fit its whole budget, or no server could answer it (NEVER: 4xx);
- and every request already admitted (running, or waiting ahead of it) that fitted its own deadline before it
  came still fits after (SHED): a request that would enlarge the batch slows every sequence in it.

Only deadlines the caller set are judged (`EngineRequest.judged`): a request that sent no timeout is bounded by
the server's cap (`--max-timeout`) and its default, which end it, but is never refused by a forecast it did not
ask for. Each forecast is checked against what happened (`Engine`: the histogram
`sluicegate_forecast_error_ratio`).
"""

from __future__ import annotations

import enum
import heapq
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace

from sluicegate.engine.scheduler import Seq
from sluicegate.engine.types import EngineRequest, Priority

ALPHA = 0.1  # each step's weight in the correction (a fixed weight: a step's length does not weigh it)
SLOW_ALPHA = 0.01  # ... in the long-run correction an idle engine's decays towards
MAX_RATIO = 4.0  # one step moves the correction by at most log(4) x ALPHA
DECAY_S = 3.0  # with no step for this long, the correction has fallen to 1/e of itself (towards the calibration)
MAX_RETRY_AFTER_S = 60  # the official SDKs honour a Retry-After up to 60 s (longer: their own backoff)
PROBE_FACTOR = 2.0  # an empty engine admits, as a probe, a request whose idle forecast is within this of its time left
PROBE_S = 5.0  # ... at most once in this many seconds
HEADROOM = 0.1  # admit only a forecast this fraction inside the time left: the answer must still reach the caller
COLD_HEADROOM = 0.5  # ... and this much while no recent step has confirmed the estimate (`Speed.headroom`)
BURST_S = 1.0  # more requests than slots judged within this: a burst, judged with `COLD_HEADROOM` (`judge`)
CONFIRM_ALPHA = 1 / 16  # each step's weight in the confirmation (16 steps: 63% confirmed)
MIX_S = 5.0  # seconds of steps the share of decoding time that others' prompts took is averaged over
MAX_MIXED = 0.75  # ... counted at most this (a run forecast at most 4x its decode steps)


@dataclass(frozen=True, slots=True)
class Calibration:
    """The step model, measured at load (`Engine.calibrate`)."""

    n_slots: int
    step_1: float  # seconds, a decode step of one sequence
    step_n: float  # seconds, a decode step of n_slots sequences
    token_s: float  # seconds each prompt token adds to a step
    between: tuple[tuple[int, float], ...] = ()  # (batch, seconds) measured between 1 and n_slots, ascending

    def step(self, batch: int) -> float:
        """Linear between the measured batch sizes: a step is not linear in its batch on a CPU (two sequences
        took 1.9x one, sixteen 8.9x: the first extra sequence leaves the one-row kernels), so a straight line
        from 1 to n under-estimated the batches a burst fills by up to 27%."""
        if self.n_slots <= 1:
            return self.step_1
        b = min(max(batch, 1), self.n_slots)
        lo_b, lo_s = 1, self.step_1
        for hi_b, hi_s in (*self.between, (self.n_slots, max(self.step_1, self.step_n))):
            if b <= hi_b:
                return lo_s + max(0.0, hi_s - lo_s) * (b - lo_b) / max(1, hi_b - lo_b)
            lo_b, lo_s = hi_b, max(lo_s, hi_s)
        return lo_s

    def cost(self, decoding: int, prompt_tokens: int) -> float:
        """A step carrying `decoding` decode tokens and `prompt_tokens` prompt tokens."""
        return self.step(decoding) + prompt_tokens * self.token_s


@dataclass(frozen=True, slots=True)
class Speed:
    """The model and its correction at one moment (immutable: published by reference, read without a lock)."""

    calibration: Calibration | None = None
    # the correction's logarithm at one sequence and at every slot (linear in between), as of `at`
    log_1: float = 0.0
    log_n: float = 0.0
    slow_1: float = 0.0  # the same averaged over many more steps (`SLOW_ALPHA`), never decayed
    slow_n: float = 0.0
    log_p: float = 0.0  # the correction's logarithm for the prompt tokens a step carries, and its long run
    slow_p: float = 0.0
    mixed: float = 0.0  # of the time steps carried decodes, the share other requests' prompts took, as of `at`
    at: float = 0.0  # monotonic time of the last step measured
    steps: int = 0
    sure: float = 0.0  # how far recent steps have confirmed the estimate, 0 to 1, as of `at` (`headroom`)

    @property
    def measured(self) -> bool:
        """A forecast exists (the engine was calibrated)."""
        return self.calibration is not None

    def _decayed(self, now: float) -> float:
        return math.exp(-max(0.0, now - self.at) / DECAY_S)

    def _ends(self, now: float) -> tuple[float, float]:
        """The correction's logarithms at both ends, decayed over idle time towards the faster of the calibration
        and the long-run correction: never towards a slower estimate than either, so an idle engine always ends
        up admitting what either says fits (a calibration taken while other work held the cores is corrected
        by the long-run average, and a long-run average from a busy hour by the calibration)."""
        k = self._decayed(now)
        t1, tn = min(0.0, self.slow_1), min(0.0, self.slow_n)
        return t1 + (self.log_1 - t1) * k, tn + (self.log_n - tn) * k

    def headroom(self, now: float) -> float:
        """The fraction a forecast must fit inside the time left. `HEADROOM` once recent steps have confirmed
        the estimate; up to `COLD_HEADROOM` while none has (a freshly started server, or one idle for a while):
        a calibration is a few seconds' measurement, the machine may be slower by the time a burst comes (a
        neighbour on the same cores, the burst's own requests parsed beside the engine), and a burst is judged
        whole before its first step can correct it. Confirmation decays with idle time like the correction.
        (A burst on a confirmed estimate is judged as unconfirmed too: `judge(burst=...)`.)"""
        sure = self.sure * math.exp(-max(0.0, now - self.at) / DECAY_S)
        return HEADROOM + (COLD_HEADROOM - HEADROOM) * (1.0 - sure)

    def _weight(self, batch: int) -> float:
        c = self.calibration
        return 0.0 if c is None or c.n_slots <= 1 else (min(max(batch, 1), c.n_slots) - 1) / (c.n_slots - 1)

    def scale(self, now: float, batch: int = 1) -> float:
        """Measured / modelled step time at `batch` sequences."""
        w, (l1, ln) = self._weight(batch), self._ends(now)
        return math.exp((1 - w) * l1 + w * ln)

    def _log_p(self, now: float) -> float:
        t = min(0.0, self.slow_p)
        return t + (self.log_p - t) * self._decayed(now)

    def prompt_scale(self, now: float) -> float:
        """Measured / modelled cost of the prompt tokens a step carries (decays like `scale`)."""
        return math.exp(self._log_p(now))

    def interrupted(self, now: float) -> float:
        """Of the time a running request's steps take, the share other requests' prompts add (0 to `MAX_MIXED`):
        measured over the last `MIX_S` seconds of steps that carried decodes, decayed with idle time (an idle
        engine has no one arriving). What requests admitted later will cost one running now (`plan`)."""
        return min(MAX_MIXED, self.mixed * self._decayed(now))

    def best_scale(self, now: float) -> float:
        """The most optimistic correction known for one sequence: what an idle server's forecast uses (NEVER)."""
        return min(1.0, math.exp(self.slow_1), self.scale(now, 1))

    def rate(self, now: float) -> float:
        """Decode tokens per second with every slot busy (0 before calibration)."""
        c = self.calibration
        return 0.0 if c is None else c.n_slots / (c.step_n * self.scale(now, c.n_slots))


class Throughput:
    """Written by the engine thread (calibration, then every step); `speed` is its latest snapshot."""

    def __init__(self) -> None:
        self.speed = Speed()

    def calibrate(self, calibration: Calibration, now: float) -> None:
        self.speed = Speed(calibration, at=now)

    def observe(self, decoding: int, prompt_tokens: int, seconds: float, now: float) -> None:
        """One step of `decoding` decode tokens and `prompt_tokens` prompt tokens took `seconds`, ending `now`
        (only the time before it, idle, decays the correction).

        A step of decodes alone corrects the decode model (`scale`); a step that carries prompt tokens corrects
        their cost (`prompt_scale`) with what it took beyond its decodes' corrected time: prompt tokens beside
        16 decodes cost twice what they cost alone here, so one correction for both inflated the decode steps'
        by 8% while under-estimating the prefills'. And steps with decodes measure how much of their time
        others' prompts took (`interrupted`)."""
        s = self.speed
        c = s.calibration
        if c is None or seconds <= 0 or decoding + prompt_tokens <= 0:
            return
        before = now - seconds
        (log_1, log_n), log_p = s._ends(before), s._log_p(before)  # decayed over the idle time before it
        slow_1, slow_n, slow_p = s.slow_1, s.slow_n, s.slow_p
        decode_s = c.step(decoding) * s.scale(before, max(decoding, 1))
        if prompt_tokens and c.token_s > 0:
            x = math.log(min(MAX_RATIO, max(1.0 / MAX_RATIO, (seconds - decode_s) / (prompt_tokens * c.token_s))))
            log_p += ALPHA * (x - log_p)
            slow_p = s.slow_p + SLOW_ALPHA * (x - s.slow_p)
        elif not prompt_tokens:
            # least mean squares on the two ends: the error of the correction at this batch size, shared between
            # the ends by how near the batch is to each
            w, x = s._weight(decoding), math.log(min(MAX_RATIO, max(1.0 / MAX_RATIO, seconds / c.step(decoding))))
            err, slow_err = x - ((1 - w) * log_1 + w * log_n), x - ((1 - w) * s.slow_1 + w * s.slow_n)
            log_1, log_n = log_1 + ALPHA * (1 - w) * err, log_n + ALPHA * w * err
            slow_1, slow_n = s.slow_1 + SLOW_ALPHA * (1 - w) * slow_err, s.slow_n + SLOW_ALPHA * w * slow_err
        k = s._decayed(before)
        mixed = s.mixed * k
        if decoding:  # a share of time: each step weighs its length
            took = max(0.0, seconds - decode_s) / seconds if prompt_tokens else 0.0
            mixed += min(1.0, seconds / MIX_S) * (took - mixed)
        self.speed = replace(s, log_1=log_1, log_n=log_n, slow_1=slow_1, slow_n=slow_n, log_p=log_p, slow_p=slow_p,
                             mixed=mixed, at=now, steps=s.steps + 1,
                             sure=1.0 - (1.0 - s.sure * k) * (1 - CONFIRM_ALPHA))


@dataclass(frozen=True, slots=True)
class Work:
    """One request in the engine, as admission sees it."""

    prompt: int  # prompt tokens still to compute
    new: int  # new tokens still expected
    priority: Priority = Priority.INTERACTIVE
    deadline: float | None = None  # the caller's own deadline (monotonic): admission keeps it; None: none judged
    key: str = ""  # the request's id


@dataclass(slots=True)
class Load:
    """What the engine holds: published by the engine thread under the engine's lock, plus what was submitted
    since (the inbox). `waiting` is in arrival order."""

    running: list[Work] = field(default_factory=list)
    waiting: list[Work] = field(default_factory=list)

    def copy(self) -> Load:
        return Load(list(self.running), list(self.waiting))

    def merge(self, other: Load) -> Load:
        """Add `other`'s waiting requests to this one's (its running ones are the engine's own)."""
        self.waiting.extend(other.waiting)
        return self

    @property
    def n_waiting(self) -> int:
        return len(self.waiting)

    @property
    def tokens(self) -> int:
        """Tokens of work in it (the drain-rate Retry-After of a full queue)."""
        return sum(w.prompt + w.new for w in (*self.running, *self.waiting))


def expected_new(request: EngineRequest) -> int:
    """The new tokens a request is expected to generate: the serving core's estimate, else its limit."""
    est = request.estimated_new_tokens
    return request.params.max_new_tokens if est is None else min(est, request.params.max_new_tokens)


def work_of(request: EngineRequest, prompt: int | None = None, made: int = 0) -> Work:
    return Work(len(request.prompt_ids) if prompt is None else prompt, max(0, expected_new(request) - made),
                request.priority, request.deadline if request.judged else None, request.request_id)


def load_of(running: Iterable[Seq], waiting: Iterable[Seq], cached: Mapping[str, int] | None = None) -> Load:
    """The load the scheduler's queues hold (engine thread); `cached`: prompt tokens each waiting request is
    expected to take from the prefix cache (engine/reuse.py)."""
    cached = cached or {}
    return Load(
        [work_of(s.request, s.prompt_len - min(s.num_computed, s.prompt_len), len(s.output_ids)) for s in running],
        [work_of(s.request, s.prompt_len - cached.get(s.request.request_id, 0))
         for s in sorted(waiting, key=lambda s: s.order)],
    )


@dataclass(frozen=True, slots=True)
class Shape:
    """The engine's geometry the forecast needs."""

    n_slots: int  # sequences decoded together
    chunk_tokens: int  # the most tokens one step carries (a prompt chunk's upper bound)


@dataclass(frozen=True, slots=True)
class Forecast:
    wait_s: float  # until a slot is its
    first_token_s: float  # from now
    total_s: float  # from now
    step_s: float  # one decode step at the batch it joins
    idle_first_token_s: float  # on an empty engine, at best
    idle_total_s: float


def _times(c: Calibration, shape: Shape, step: float, scale: float, w: Work, token_s: float
           ) -> tuple[float, float]:
    """(prefill, whole run) seconds of `w` at `step` per decode step (corrected) and `token_s` a prompt token."""
    prefill = math.ceil(w.prompt / shape.chunk_tokens) * step * scale + w.prompt * token_s if w.prompt else 0.0
    return prefill, prefill + max(w.new - (1 if w.prompt else 0), 0) * step * scale


def plan(speed: Speed, load: Load, shape: Shape, now: float, new: Work | None = None
         ) -> tuple[list[tuple[Work, float]], tuple[float, float, float] | None]:
    """When each request of `load` (running, then waiting in scheduling order) would finish, with `new` queued
    behind everyone of its priority or higher; and `new`'s (start, first token, finish), all absolute.

    A prompt's prefill is not only its own request's time: the steps that carry its chunks carry every running
    sequence's decode too, so each prefill that starts while a request runs delays that request by the prompt's
    cost. The plan is made twice: once to learn when each request starts, then again with every request's end
    moved by the prefills that start while it runs (a request admitted into a busy batch costs the others its
    prefill; without this, a cold burst of 8 prompts was forecast to finish in time and did not).

    Requests that come later start only once every request known now has (the queue is first come, first
    served within a priority); from then on, each request's remaining time is stretched by the share of time
    others' prompts have lately taken (`Speed.interrupted`): at twice capacity every slot that frees is filled
    at once, and a request running 64 steps shared them with ~15 prefills that came after it (6.9 s against a
    forecast of 5.2 without this)."""
    c = speed.calibration
    assert c is not None
    queue = sorted(load.waiting, key=lambda w: w.priority)  # stable: arrival order within a priority
    if new is not None:
        at = next((i for i, w in enumerate(queue) if w.priority > new.priority), len(queue))
        queue.insert(at, new)
    b = min(shape.n_slots, len(load.running) + len(queue))
    step, scale, token_s = c.step(b), speed.scale(now, b), c.token_s * speed.prompt_scale(now)
    works = [*load.running, *queue]
    stalls = [0.0] * len(works)
    for rnd in range(2):
        spans = _spans(c, shape, step, scale, token_s, now, len(load.running), works, stalls)
        if rnd == 0:
            stalls = [sum(works[j].prompt * token_s for j, (s_j, _, _) in enumerate(spans)
                          if j != i and s_i <= s_j < e_i) for i, (s_i, _, e_i) in enumerate(spans)]
    known = max((s_ for s_, _, _ in spans[len(load.running):]), default=now)  # when the last known one starts
    stretch = 1 / (1 - speed.interrupted(now)) - 1
    spans = [(s_, f_, e_ + stretch * max(0.0, e_ - max(s_, known))) for s_, f_, e_ in spans]
    ends = [(w, e) for w, (_, _, e) in zip(works, spans, strict=True) if w is not new]
    mine = next(((s_, f_, e_) for w, (s_, f_, e_) in zip(works, spans, strict=True) if w is new), None)
    return ends, mine


def _spans(c: Calibration, shape: Shape, step: float, scale: float, token_s: float, now: float, n_running: int,
           works: list[Work], stalls: list[float]) -> list[tuple[float, float, float]]:
    """(start, first token, end) of each of `works` (the first `n_running` running), each end moved by its stall."""
    free = [now] * max(0, shape.n_slots - n_running)
    spans: list[tuple[float, float, float]] = []
    for i, w in enumerate(works):
        prefill, total = _times(c, shape, step, scale, w, token_s)
        start = now if i < n_running else (heapq.heappop(free) if free else now)
        end = start + total + stalls[i]
        spans.append((start, start + prefill, end))
        heapq.heappush(free, end)
    return spans


def forecast(speed: Speed, load: Load, shape: Shape, prompt_tokens: int, new_tokens: int,
             priority: Priority, now: float = 0.0) -> Forecast | None:
    """The forecast for one run of `prompt_tokens` + `new_tokens`, in seconds from `now` (None: not calibrated)."""
    c = speed.calibration
    if c is None:
        return None
    w = Work(prompt_tokens, new_tokens, priority)
    _, mine = plan(speed, load, shape, now, w)
    assert mine is not None
    start, first, end = mine
    best = speed.best_scale(now)
    idle_first, idle_total = _times(c, shape, c.step_1, best, w, c.token_s * min(1.0, speed.prompt_scale(now)))
    b = min(shape.n_slots, len(load.running) + len(load.waiting) + 1)
    step = c.step(b) * speed.scale(now, b)
    return Forecast(start - now, first - now, end - now, step, idle_first, idle_total)


def retry_after_s(over_s: float) -> int:
    """Retry-After (whole seconds) for a request whose forecast is `over_s` seconds past its deadline: by then
    the work ahead of it has drained that much, so it would fit."""
    return max(1, min(MAX_RETRY_AFTER_S, math.ceil(over_s)))


class Verdict(enum.Enum):
    FITS = "fits"  # admit (also: no deadline of the caller's, or no calibration)
    SHED = "shed"  # cannot finish in time at the present load, or would push others out: 503, Retry-After
    NEVER = "never"  # cannot finish in time even on an idle server: the caller must change the request


@dataclass(frozen=True, slots=True)
class Judgement:
    verdict: Verdict
    needed_s: float = 0.0  # the forecast (NEVER: the idle one) for the bound that failed
    left_s: float = 0.0  # time left before that bound (NEVER: the whole budget, from the request's arrival)
    first_token: bool = False  # the bound that failed is the first-token deadline (streams)
    wait_s: float = 0.0
    displaces: bool = False  # SHED because admitting it would push an admitted request past its deadline
    forecast: Forecast | None = None
    probe: bool = False  # FITS only as a probe: the forecast said no, but an empty engine measures it (`judge`)

    @property
    def retry_after(self) -> int:
        """Whole seconds until the work ahead has drained enough for this request to fit."""
        return retry_after_s(self.needed_s - self.left_s)

    def describe(self) -> str:
        if self.displaces:
            return (f"admitting it would make a request already running miss its deadline (by "
                    f"{self.needed_s - self.left_s:.1f} s at the measured speed)")
        bound = "first token" if self.first_token else "answer"
        return (f"the {bound} would take {self.needed_s:.1f} s ({self.wait_s:.1f} s waiting for a slot, at the "
                f"measured speed); the deadline is {max(self.left_s, 0.0):.1f} s away")


class DeadlineTooShort(Exception):
    """The request cannot meet its deadline even on an idle server (`judgement` has the numbers)."""

    def __init__(self, judgement: Judgement) -> None:
        bound = "first token" if judgement.first_token else "answer"
        super().__init__(f"the {bound} needs {judgement.needed_s:.1f} s at best; {judgement.left_s:.1f} s are left")
        self.judgement = judgement


def _displaced(speed: Speed, load: Load, shape: Shape, now: float, new: Work, headroom: float
               ) -> tuple[float, float] | None:
    """(needed, left) of the first admitted request that fits its deadline now and would not with `new`."""
    before, _ = plan(speed, load, shape, now)
    after, _ = plan(speed, load, shape, now, new)
    was = {id(w): end for w, end in before}
    running = {id(w) for w in load.running}
    for w, end in after:
        if w.deadline is None or (w.priority > new.priority and id(w) not in running):
            continue  # lower-priority waiting work is scheduled after `new` by design
        need = (end - now) * (1 + headroom)
        if need > w.deadline - now and (was[id(w)] - now) * (1 + headroom) <= w.deadline - now:
            return need, w.deadline - now
    return None


def judge(speed: Speed, load: Load, shape: Shape, request: EngineRequest, now: float, *,
          probe: bool = False, cached: int = 0, burst: bool = False) -> Judgement:
    """Whether one run can meet its caller's deadlines (the whole answer's, and a stream's first token) without
    pushing an admitted request past its own. NEVER compares the idle forecast with the whole budget (from the
    request's arrival): time the server already spent on it (a slow tokenisation under load) makes it SHED,
    the server's fault, not the caller's.

    `probe`: the engine may admit one request it would refuse, as a measurement. Taken only on an empty engine
    (nothing else is slowed, no compute is taken from anyone) and for a request whose idle forecast is within
    `PROBE_FACTOR` of its time left: the calibration may be that wrong (taken while other work held the cores),
    and without steps nothing corrects it (`Judgement.probe`).

    `cached`: prompt tokens the prefix cache is expected to serve (engine/reuse.py): not computed, not charged.
    `burst`: more requests came in the last second than the engine has slots: the estimate is judged as an
    unconfirmed one (`COLD_HEADROOM`), however many steps confirmed it before (`Speed.headroom`)."""
    headroom = COLD_HEADROOM if burst else speed.headroom(now)
    j = _judge(speed, load, shape, request, now, cached, headroom)
    if (probe and j.verdict is not Verdict.FITS and not j.displaces and not load.running and not load.waiting
            and j.forecast is not None):
        f = j.forecast
        idle = [(f.idle_first_token_s if first else f.idle_total_s, d) for d, first in _bounds(request)]
        if all(need <= PROBE_FACTOR * (d - now) for need, d in idle):
            return Judgement(Verdict.FITS, forecast=f, probe=True)
    return j


def _bounds(request: EngineRequest) -> list[tuple[float, bool]]:
    """(deadline, is the first token's) of each deadline the caller set."""
    answer = request.deadline if request.judged else None  # a stream's first-token deadline is always the caller's
    return [(d, first) for d, first in ((answer, False), (request.first_token_deadline, True)) if d is not None]


def _judge(speed: Speed, load: Load, shape: Shape, request: EngineRequest, now: float, cached: int,
           headroom: float) -> Judgement:
    prompt = len(request.prompt_ids) - cached
    f = forecast(speed, load, shape, prompt, expected_new(request), request.priority, now)
    bounds = _bounds(request)
    if f is None or not bounds:
        return Judgement(Verdict.FITS, forecast=f)
    shed: Judgement | None = None
    for deadline, first in bounds:
        budget, left = deadline - request.arrival, deadline - now  # the time already spent is the server's
        idle, need = (f.idle_first_token_s, f.first_token_s) if first else (f.idle_total_s, f.total_s)
        if idle > budget:
            return Judgement(Verdict.NEVER, idle, budget, first, f.wait_s, forecast=f)
        if need * (1 + headroom) > left and shed is None:
            shed = Judgement(Verdict.SHED, need * (1 + headroom), left, first, f.wait_s, forecast=f)
    if shed is not None:
        return shed
    pushed = _displaced(speed, load, shape, now, work_of(request, prompt), headroom)
    if pushed is not None:
        return Judgement(Verdict.SHED, pushed[0], pushed[1], False, f.wait_s, displaces=True, forecast=f)
    return Judgement(Verdict.FITS, forecast=f)
