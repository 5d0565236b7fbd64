"""The serving core every surface shares: admission checks, fan-out to engine runs, collection, refusals.

A surface (generate, chat, completions, predictions, Messages, Responses; batch items run through the same ones) is
an adapter (serving/surface.py): it converts its protocol model once to token ids and one `SamplingParams`, and
shapes the result. Everything between is here, so every surface gets the same rules:

- `check_tokens`: the token budget with every `LimitsConfig` rule (prompt-token limit, window, new-token
  limit), and `check_text_bytes`, the untokenised pre-check that refuses a huge text in microseconds;
- `start_runs`: `n` choices per prompt fanned out once (run i seeded `seed + i`, so every choice can be
  replayed alone), engine ids unique per request, tenant/priority/deadlines from the request context (a
  stream's when it streams: serving/deadline.py), the request's one cost estimate and its admission
  (serving/admission.py), the engine's refusals mapped to the envelope (the deadline forecast's among them)
  and an upstream client's lifted;
- `Runs`: the started runs, read through one `OutputCollector` (no task per run or per event): `events()`
  for streams (with heartbeat cues), `collect()` for whole answers; leaving early aborts what is left;
- `finish_error`: what a run's end means for its client.

The cost (`Runs.cost`) is what rate limits and monthly budgets reserve: prompt tokens plus the new tokens
each run may generate, so a request that sets no limit (chat without `max_tokens`) reserves to the end of its
window (or the server's new-token cap) and settles to its real count: no run can take more than it reserved.
Deadline admission forecasts with an expectation instead (`EngineRequest.estimated_new_tokens`: the request's
limit, else `LimitsConfig.estimate_new_tokens`; docs/serving.md).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field

from sluicegate.engine import (
    DeadlineTooShort,
    EngineOverloaded,
    EngineRequest,
    EngineStopped,
    FinishReason,
    RequestOutput,
    SamplingParams,
    TokenLogprob,
)
from sluicegate.engine.client import OutputCollector
from sluicegate.engine.types import Constraint
from sluicegate.refusal import Rejected
from sluicegate.serving import deadline
from sluicegate.serving.admission import OPEN, Admission
from sluicegate.serving.context import RequestContext
from sluicegate.serving.errors import ApiError
from sluicegate.serving.models import EngineClient, ServedModel, check_text
from sluicegate.telemetry import tracing

log = logging.getLogger("sluicegate.serving")

HEARTBEAT_S = 15.0  # a stream silent this long gets a heartbeat cue (an SSE comment), so proxies keep it open
MAX_SEED = 2**63 - 1


def engine_error(exc: Exception) -> ApiError:
    """Map the engine's refusals to the envelope (anything else is a bug and re-raises)."""
    if isinstance(exc, EngineOverloaded):
        return ApiError("overloaded", str(exc), retry_after=exc.retry_after, code=exc.code)
    if isinstance(exc, EngineStopped):
        return ApiError("shutting_down", str(exc), retry_after=5)
    raise exc


def finish_error(out: RequestOutput) -> ApiError | None:
    """The error a finished run means for its client, if any (logged here, once)."""
    if out.finish_reason is FinishReason.ERROR and out.error_type is not None:  # an upstream's typed failure
        return ApiError(out.error_type, out.error or "the upstream failed", retry_after=out.retry_after)
    if out.finish_reason is FinishReason.ERROR:
        log.error("%s engine error: %s", out.request_id, out.error)
        return ApiError("internal_error", "internal error; report the request id")
    if out.finish_reason is FinishReason.CANCELLED:
        return ApiError(
            "shutting_down", "the request was cancelled: the server is shutting down", retry_after=5
        )
    if out.finish_reason is FinishReason.EXPIRED:
        done = f" after {out.completion_tokens} new tokens" if out.completion_tokens else " before it started"
        return ApiError("deadline_exceeded", f"the request's deadline passed{done}", code="deadline_exceeded")
    return None


def check_text_bytes(model: ServedModel, text: str, param: str, *, parse_special: bool = False) -> None:
    """Refuse text that is not valid Unicode, or whose byte length alone proves it over the prompt limit."""
    n_bytes = check_text(text, param)
    model.token_budget.check_prompt_bytes(n_bytes, param=param, parse_special=parse_special)


def check_tokens(model: ServedModel, prompt_tokens: int, max_new: int, *, prompt_param: str,
                 new_param: str) -> None:
    """Every token rule of the served model's budget (serving/budget.py), with the surface's names."""
    model.token_budget.check(prompt_tokens, max_new, prompt_param=prompt_param, new_param=new_param)


def default_new_tokens(model: ServedModel, prompt_tokens: int) -> int:
    """A request that sets no limit may generate to the end of the window, capped by the server's limit."""
    room = model.limits.n_ctx - prompt_tokens
    cap = model.token_budget.max_new_tokens
    return room if cap is None else min(room, cap)


def run_seed(seed: int | None, i: int) -> int | None:
    return None if seed is None else (seed + i) % (MAX_SEED + 1)


@dataclass(slots=True)
class RunResult:
    """One run merged: every delta's text, ids and logprobs, and the final counts."""

    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[TokenLogprob] = field(default_factory=list)
    final: RequestOutput | None = None


class Runs:
    """The engine runs of one API request, submitted together and read as one stream of (index, delta)."""

    def __init__(self, engine: EngineClient, requests: Sequence[EngineRequest], cost: int) -> None:
        self.requests = list(requests)
        self.cost = cost  # tokens: prompt plus the new tokens each run may generate (module doc)
        self._engine = engine
        self._collector: OutputCollector | None = None
        self._open: set[int] = set()
        self.delivered = [0] * len(self.requests)  # new tokens read per run (metering a client that left)
        self.finals: list[RequestOutput | None] = [None] * len(self.requests)  # each finished run's last output

    def start(self) -> None:
        """Submit every run; a refusal raises ApiError here, before any output: the local engine's overload or
        shutdown mapped, an upstream client's (`Rejected`: an open circuit, what its hop cannot carry) lifted."""
        try:
            self._collector = self._engine.submit(self.requests)
        except (EngineOverloaded, EngineStopped) as exc:
            raise engine_error(exc) from None
        except Rejected as exc:
            raise ApiError.of(exc) from None
        self._open = set(range(len(self.requests)))

    async def events(
        self, heartbeat_s: float | None = None,
    ) -> AsyncIterator[tuple[int, RequestOutput] | None]:
        """Deltas in arrival order until every run has finished; `None` when `heartbeat_s` passed without
        output. Leaving early (or being cancelled) aborts the runs still going."""
        collector = self._collector
        assert collector is not None, "start() first"
        try:
            while self._open:
                batch = await collector.get(heartbeat_s)
                if not batch:
                    yield None
                for i, out in batch:
                    self.delivered[i] += len(out.new_token_ids)
                    if out.finished:
                        self._open.discard(i)
                        self.finals[i] = out
                        if out.timing is not None and tracing.enabled():
                            tm = out.timing
                            tracing.engine_stages(self.requests[i].request_id.split("#", 1)[0], i, tm.queue_ms,
                                                  tm.prefill_ms, tm.decode_ms)
                    yield i, out
        finally:
            self.close()

    async def collect(self) -> list[RunResult]:
        """Every run to its end (closing them whatever happens)."""
        results = [RunResult() for _ in self.requests]
        async for ev in self.events():
            assert ev is not None
            i, out = ev
            r = results[i]
            r.text += out.text
            r.token_ids.extend(out.new_token_ids)
            r.logprobs.extend(out.logprobs)
            if out.finished:
                r.final = out
        return results

    def close(self) -> None:
        """Abort every run that has not finished (each frees its slot within one engine step)."""
        for i in sorted(self._open):
            self._engine.abort(self.requests[i].request_id)
        self._open.clear()


async def start_runs(
    model: ServedModel,
    ctx: RequestContext,
    prompts: Sequence[list[int]],
    params: SamplingParams,
    *,
    n: int = 1,
    requested_new: int | None = None,
    new_param: str | None = None,
    constraint: Callable[[], Constraint] | None = None,
    stream: bool = False,
    admission: Admission = OPEN,
) -> Runs:
    """Fan out `n` runs per prompt (choice `p * n + i` is run i of prompt p, seeded `seed + i`), build the
    engine requests from the context, pass their `admission` (serving/admission.py: the cost reserved, an
    Idempotency-Key's gate passed), and start them.
    `requested_new` is the request's own new-token limit, named `new_param` (None when it set none: the cost
    then runs to the window, and the deadline forecast expects `estimate_new_tokens`). `constraint`, when
    given, makes each run's own decoding constraint. `stream`: the answer is streamed, so the context's
    stream deadlines apply."""
    if stream:
        ctx.streaming()
    single = len(prompts) * n == 1
    estimate = model.token_budget.estimate_new_tokens
    requests: list[EngineRequest] = []
    cost = 0
    judged = deadline.caller_set(ctx, stream=stream)
    for k, ids in enumerate(prompts):
        for i in range(n):
            run = dataclasses.replace(params, seed=run_seed(params.seed, i)) if n > 1 else params
            rid = ctx.engine_id if single else f"{ctx.engine_id}:{k * n + i}"
            expected = run.max_new_tokens if requested_new is not None else min(run.max_new_tokens, estimate)
            requests.append(EngineRequest(
                rid, ids, run, arrival=ctx.arrival, priority=ctx.priority, tenant=ctx.tenant,
                deadline=ctx.deadline, first_token_deadline=ctx.first_token_deadline, judged=judged,
                estimated_new_tokens=expected,
                constraint=None if constraint is None else constraint(),
            ))
            cost += len(ids) + run.max_new_tokens  # what it may cost: a reservation it can never outrun
    runs = Runs(model.engine, requests, cost)
    ctx.record.finals = runs.finals  # filled as the runs end: the access log's finish reason and stage times
    await admission.admit(ctx, cost, new_param)
    try:
        runs.start()
    except DeadlineTooShort as exc:
        raise deadline.too_short(exc, ctx, stream=stream, new_param=new_param) from None
    return runs


async def collect_finished(runs: Runs, ctx: RequestContext) -> list[RunResult]:
    """Every run to its end; the first engine failure raises; the first run's stage times go to
    Server-Timing."""
    results = await runs.collect()
    for r in results:
        assert r.final is not None
        err = finish_error(r.final)
        if err is not None:
            raise err
    first = results[0].final
    if first is not None and first.timing is not None:
        ctx.record.engine(first.timing)
    return results
