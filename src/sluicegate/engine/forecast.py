"""Deadline admission: how long a new request would wait and take, from the engine's measured speed.

The engine thread measures every step (`Throughput.observe`): the tokens it carried (prompt chunks plus one
decode token per running sequence) over its wall time. Two exponentially weighted moving averages over *busy*
time (idle time between steps does not count: a server idle for an hour has not become slow), with a time
constant of `TAU_S` seconds of work:

- `rate`, tokens per second: the engine's drain rate, whatever the batch holds;
- `step_s`, seconds per step: how long one decode token takes a running sequence at the present load;
- `batch`, sequences per step: the load `step_s` was measured at;

and the best ever seen, an idle server's speed: `peak_rate` (the fastest tokens per second of any step: a
full prompt chunk) and `fastest_step_s` (the shortest step: a lone decode token). Hand-written: three
numbers updated per step; a metrics library would add a lock and an allocation per step for nothing.

A request's forecast (`forecast`), from the load the engine thread publishes (`Load`):

    wait        = 0 when a free slot is left for every run and nobody of its priority or higher waits,
                  else work_ahead / rate           (work_ahead: tokens every running sequence, and every
                                                    waiting request of its priority or higher, still has to
                                                    process: running ones are never preempted)
    step        = step time at the batch the request would join: b = min(slots, running + waiting ahead + 1),
                  fastest_step_s + (step_s - fastest_step_s) * (b - 1) / (batch - 1)
    prefill     = max(ceil(prompt / chunk) * step, prompt / peak_rate)
    first token = wait + prefill                   (the last prompt chunk's step samples the first token)
    total       = wait + prefill + (new_tokens - 1) * step     (then one token per step)
    idle        = prompt / peak_rate + (new_tokens - 1) * fastest_step_s   (the best ever seen)

where `chunk` is the most tokens one step carries (`max_batch_tokens`): a prompt is prefilled in chunks that
take a step each, not token by token at the drain rate (which decode steps dominate).

The step time is interpolated by batch size because on a CPU a decode step's cost grows with the sequences it
carries (one pass over the weights, plus each sequence's own work): a step of 16 sequences took ~15x one of a
single sequence here. Forecasting with the step time measured at full load would refuse a request that an
engine with free slots would answer at once, and, since nothing admitted means nothing measured, go on
refusing everything after a burst (the averages only move while the engine works).

`work_ahead / rate` is the time the engine needs to drain what is ahead at its measured rate: slightly more
than the real wait when slots free up at different times. A request is admitted only when its forecast, with
`HEADROOM` (10%) added, fits the time left: the step time varies, and the answer must still reach its caller,
whose timer started before the server's. Both err towards refusing a request that might just have fitted
rather than admitting one that will expire after spending compute. Until `MIN_BUSY_S` of
work and `MIN_STEPS` steps have been measured there is no forecast, and nothing is refused by it (a cold
server must not refuse everything).
"""

from __future__ import annotations

import enum
import math
from collections.abc import Iterable
from dataclasses import dataclass, field

from sluicegate.engine.scheduler import Seq
from sluicegate.engine.types import EngineRequest, Priority

TAU_S = 5.0  # the averages' time constant, in seconds of busy time
MIN_BUSY_S = 1.0  # measured work needed before a forecast refuses anything
MIN_STEPS = 16  # ... and this many steps
MAX_RETRY_AFTER_S = 60  # the official SDKs honour a Retry-After up to 60 s (longer: their own backoff)
HEADROOM = 0.1  # admit only a forecast this fraction inside the time left: the answer must still reach the caller


@dataclass(frozen=True, slots=True)
class Speed:
    """The measured speed at one moment (immutable: published by reference, read without a lock)."""

    rate: float = 0.0  # tokens per busy second, EWMA
    step_s: float = 0.0  # seconds per step, EWMA
    peak_rate: float = 0.0  # fastest tokens per second of any step
    fastest_step_s: float = math.inf  # shortest step
    batch: float = 0.0  # sequences per step, EWMA: the load step_s was measured at
    busy_s: float = 0.0  # work measured so far
    steps: int = 0

    @property
    def measured(self) -> bool:
        return self.busy_s >= MIN_BUSY_S and self.steps >= MIN_STEPS and self.rate > 0


class Throughput:
    """Written by the engine thread after each step; `speed` is its latest snapshot."""

    def __init__(self) -> None:
        self.speed = Speed()

    def observe(self, tokens: int, seconds: float, seqs: int = 1) -> None:
        if tokens <= 0 or seconds <= 0:
            return
        s = self.speed
        a = 1.0 - math.exp(-seconds / TAU_S)  # weight by time: a long step counts for more of the average
        first = s.steps == 0
        self.speed = Speed(
            rate=tokens / seconds if first else s.rate + a * (tokens / seconds - s.rate),
            step_s=seconds if first else s.step_s + a * (seconds - s.step_s),
            peak_rate=max(s.peak_rate, tokens / seconds),
            fastest_step_s=min(s.fastest_step_s, seconds),
            batch=seqs if first else s.batch + a * (seqs - s.batch),
            busy_s=s.busy_s + seconds,
            steps=s.steps + 1,
        )


@dataclass(slots=True)
class Load:
    """What the engine holds, as admission sees it: published by the engine thread under the engine's lock,
    plus what was submitted since (the inbox)."""

    running: int = 0  # sequences holding a slot
    running_work: int = 0  # tokens they still have to process (whatever their priority: no preemption)
    waiting: dict[Priority, int] = field(default_factory=dict)  # requests waiting, by priority
    work: dict[Priority, int] = field(default_factory=dict)  # tokens the waiting ones will process, by priority

    def add(self, priority: Priority, tokens: int) -> None:
        """One more waiting request of `tokens` work."""
        self.work[priority] = self.work.get(priority, 0) + tokens
        self.waiting[priority] = self.waiting.get(priority, 0) + 1

    def ahead_of(self, priority: Priority) -> tuple[int, int]:
        """(requests waiting, tokens of work) that a new request of `priority` would find ahead of it: every
        running sequence's, and the waiting ones of its priority or higher (they are scheduled first)."""
        n = sum(v for p, v in self.waiting.items() if p <= priority)
        return n, self.running_work + sum(v for p, v in self.work.items() if p <= priority)

    def copy(self) -> Load:
        return Load(self.running, self.running_work, dict(self.waiting), dict(self.work))

    def merge(self, other: Load) -> Load:
        """Add `other`'s waiting requests and work to this one (its running count is the engine's own)."""
        for p, n in other.waiting.items():
            self.waiting[p] = self.waiting.get(p, 0) + n
        for p, w in other.work.items():
            self.work[p] = self.work.get(p, 0) + w
        return self


@dataclass(frozen=True, slots=True)
class Forecast:
    wait_s: float
    first_token_s: float
    total_s: float
    idle_first_token_s: float
    idle_total_s: float


def expected_new(request: EngineRequest) -> int:
    """The new tokens a request is expected to generate: the serving core's estimate, else its limit."""
    est = request.estimated_new_tokens
    return request.params.max_new_tokens if est is None else min(est, request.params.max_new_tokens)


def load_of(running: Iterable[Seq], waiting: Iterable[Seq]) -> Load:
    """The load the scheduler's queues hold (engine thread): work left of each running sequence (the rest of
    its prompt, the new tokens it is still expected to make) and the whole work of each waiting one."""
    load = Load()
    for seq in running:
        load.running += 1
        prompt_left = seq.prompt_len - min(seq.num_computed, seq.prompt_len)
        load.running_work += prompt_left + max(0, expected_new(seq.request) - len(seq.output_ids))
    for seq in waiting:
        load.add(seq.request.priority, seq.prompt_len + expected_new(seq.request))
    return load


@dataclass(frozen=True, slots=True)
class Shape:
    """The engine's geometry the forecast needs."""

    n_slots: int  # sequences decoded together
    chunk_tokens: int  # the most tokens one step carries (a prompt chunk's upper bound)


def step_at(speed: Speed, batch: int) -> float:
    """The step time at `batch` sequences: linear between the fastest step (one sequence) and the average
    step at the measured batch size; the average itself when no batch size was measured."""
    fastest = min(speed.fastest_step_s, speed.step_s)
    if speed.batch <= 1.0:
        return speed.step_s
    per_seq = max(0.0, speed.step_s - fastest) / (speed.batch - 1.0)
    return fastest + per_seq * max(0, batch - 1)


def forecast(speed: Speed, load: Load, shape: Shape, prompt_tokens: int, new_tokens: int,
             priority: Priority) -> Forecast | None:
    """The forecast for one run of `prompt_tokens` + `new_tokens` (None: not measured yet)."""
    if not speed.measured:
        return None
    n_waiting, work_ahead = load.ahead_of(priority)
    free = shape.n_slots - load.running - sum(load.waiting.values())
    wait = 0.0 if free > 0 and n_waiting == 0 else work_ahead / speed.rate
    peak = max(speed.peak_rate, speed.rate)
    fastest = min(speed.fastest_step_s, speed.step_s)
    idle_prefill = max(prompt_tokens / peak, fastest)
    step = step_at(speed, min(shape.n_slots, load.running + n_waiting + 1))
    prefill = max(math.ceil(prompt_tokens / shape.chunk_tokens) * step, idle_prefill)
    decode = max(new_tokens - 1, 0)
    return Forecast(
        wait_s=wait,
        first_token_s=wait + prefill,
        total_s=wait + prefill + decode * step,
        idle_first_token_s=idle_prefill,
        idle_total_s=idle_prefill + decode * fastest,
    )


def retry_after_s(over_s: float) -> int:
    """Retry-After (whole seconds) for a request whose forecast is `over_s` seconds past its deadline: by then
    the work ahead of it has drained that much, so it would fit."""
    return max(1, min(MAX_RETRY_AFTER_S, math.ceil(over_s)))


class Verdict(enum.Enum):
    FITS = "fits"  # admit (also: no deadline, or no forecast yet)
    SHED = "shed"  # cannot finish in time at the present load: 503 overloaded, Retry-After
    NEVER = "never"  # cannot finish in time even on an idle server: the caller must change the request


@dataclass(frozen=True, slots=True)
class Judgement:
    verdict: Verdict
    needed_s: float = 0.0  # the forecast (NEVER: the idle one) for the bound that failed
    left_s: float = 0.0  # time left before that bound (NEVER: the whole budget, from the request's arrival)
    first_token: bool = False  # the bound that failed is the first-token deadline (streams)
    wait_s: float = 0.0

    @property
    def retry_after(self) -> int:
        """Whole seconds until the work ahead has drained enough for this request to fit."""
        return retry_after_s(self.needed_s - self.left_s)

    def describe(self) -> str:
        bound = "first token" if self.first_token else "answer"
        return (f"the {bound} would take {self.needed_s:.1f} s ({self.wait_s:.1f} s waiting behind the work "
                f"queued ahead, at the measured rate); the deadline is {max(self.left_s, 0.0):.1f} s away")


class DeadlineTooShort(Exception):
    """The request cannot meet its deadline even on an idle server (`judgement` has the numbers)."""

    def __init__(self, judgement: Judgement) -> None:
        bound = "first token" if judgement.first_token else "answer"
        super().__init__(f"the {bound} needs {judgement.needed_s:.1f} s at best; {judgement.left_s:.1f} s are left")
        self.judgement = judgement


def judge(speed: Speed, load: Load, shape: Shape, request: EngineRequest, now: float) -> Judgement:
    """Whether one run can meet its deadlines (the whole answer's, and a stream's first token). NEVER compares
    the idle forecast with the whole budget (from the request's arrival): time the server already spent on it
    (a slow tokenisation under load) makes it SHED, the server's fault, not the caller's."""
    bounds = [(d, first) for d, first in ((request.deadline, False), (request.first_token_deadline, True))
              if d is not None]
    if not bounds:
        return Judgement(Verdict.FITS)
    f = forecast(speed, load, shape, len(request.prompt_ids), expected_new(request), request.priority)
    if f is None:
        return Judgement(Verdict.FITS)
    shed: Judgement | None = None
    for deadline, first in bounds:
        budget, left = deadline - request.arrival, deadline - now  # the time already spent is the server's
        idle, need = (f.idle_first_token_s, f.first_token_s) if first else (f.idle_total_s, f.total_s)
        if idle > budget:
            return Judgement(Verdict.NEVER, idle, budget, first, f.wait_s)
        if need * (1 + HEADROOM) > left and shed is None:
            shed = Judgement(Verdict.SHED, need * (1 + HEADROOM), left, first, f.wait_s)
    return shed or Judgement(Verdict.FITS)
