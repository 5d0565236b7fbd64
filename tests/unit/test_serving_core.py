"""The serving core (serving/core.py) with a fake surface on the reference backend: fan-out, context fields,
cost estimate, every budget rule, refusals, heartbeats, aborts and deadlines."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from sluicegate.config import LimitsConfig
from sluicegate.engine import AsyncEngine, Engine, FinishReason, Priority, SamplingParams, SchedulerConfig
from sluicegate.engine.client import OutputCollector
from sluicegate.refusal import Rejected
from sluicegate.serving.admission import OPEN, Admission
from sluicegate.serving.budget import Budget
from sluicegate.serving.context import RequestContext
from sluicegate.serving.core import (
    Runs,
    check_text_bytes,
    check_tokens,
    collect_finished,
    default_new_tokens,
    start_runs,
)
from sluicegate.serving.errors import ApiError
from sluicegate.serving.models import ServedModel
from sluicegate.testing.wait import wait_for_async
from tests.api.threaded_server import SlowRunner


@contextmanager
def served(limits: LimitsConfig | None = None, *, delay_s: float = 0.0, max_waiting: int = 256,
           n_slots: int = 4) -> Iterator[ServedModel]:
    runner = SlowRunner(delay_s=delay_s, n_ctx=256, n_slots=n_slots)
    engine = Engine(runner, SchedulerConfig(max_waiting=max_waiting))
    engine.start()
    try:
        yield ServedModel(runner, AsyncEngine(engine), Budget.for_runner(runner, limits or LimitsConfig()))
    finally:
        engine.stop()


async def fake_surface(model: ServedModel, ctx: RequestContext, prompts: list[str], *, n: int = 1,
                 max_new: int | None = 4, seed: int | None = 7, admission: Admission = OPEN) -> Runs:
    """What a surface adapter does: its one conversion, then the core."""
    ids = [model.runner.tokenize(p) for p in prompts]
    for k, x in enumerate(ids):
        check_tokens(model, len(x), max_new or 1, prompt_param=f"prompt[{k}]", new_param="max_new")
    limit = max_new or default_new_tokens(model, max(len(x) for x in ids))
    params = SamplingParams(max_new_tokens=limit, temperature=1.0, seed=seed)
    return await start_runs(model, ctx, ids, params, n=n, requested_new=max_new, new_param="max_new",
                            admission=admission)


def test_fan_out_ids_seeds_and_context_fields() -> None:
    async def main() -> None:
        with served() as model:
            deadline = time.monotonic() + 600
            ctx = RequestContext("req_a", tenant="key_1", priority=Priority.BATCH, deadline=deadline)
            runs = await fake_surface(model, ctx, ["ab", "cde"], n=3)
            reqs = runs.requests
            assert [r.request_id for r in reqs] == [f"{ctx.engine_id}:{i}" for i in range(6)]
            assert [r.params.seed for r in reqs] == [7, 8, 9, 7, 8, 9]  # choice p*n+i: run i of prompt p
            assert all(r.tenant == "key_1" and r.priority is Priority.BATCH and r.deadline == deadline
                       for r in reqs)
            assert all(r.arrival == ctx.arrival for r in reqs)
            results = await collect_finished(runs, ctx)
            assert [len(r.token_ids) for r in results] == [4] * 6
            assert [r.final.seed for r in results if r.final] == [7, 8, 9, 7, 8, 9]
            assert "queue" in ctx.record.stages_ms and "decode" in ctx.record.stages_ms

            one = await fake_surface(model, RequestContext("req_b"), ["ab"])
            assert [r.request_id for r in one.requests] == [one.requests[0].request_id]
            assert "#" in one.requests[0].request_id and ":" not in one.requests[0].request_id
            await one.collect()

    asyncio.run(main())


def test_the_cost_estimate_counts_prompt_and_possible_new_tokens() -> None:
    async def main() -> None:
        with served(LimitsConfig(estimate_new_tokens=10)) as model:
            given = await fake_surface(model, RequestContext("a"), ["abcd"], n=2, max_new=4)
            assert given.cost == 2 * (5 + 4)  # the reference tokenizer adds BOS: 5 prompt tokens
            unset = await fake_surface(model, RequestContext("b"), ["abcd"], max_new=None)
            assert unset.requests[0].params.max_new_tokens == 256 - 5  # may run to the end of the window
            assert unset.cost == 5 + 251  # reserved to the window: it can never take more than that
            assert unset.requests[0].estimated_new_tokens == 10  # what the deadline forecast expects
            unset.close()
            await given.collect()

    asyncio.run(main())


@pytest.mark.parametrize(
    ("limits", "prompt", "max_new", "etype", "param"),
    [
        (LimitsConfig(max_prompt_tokens=8), "x" * 20, 4, "prompt_too_long", "prompt[0]"),
        (LimitsConfig(), "x" * 250, 10, "context_length_exceeded", "max_new"),
        (LimitsConfig(max_new_tokens=5), "x", 6, "invalid_request", "max_new"),
    ],
)
def test_every_budget_rule_applies_with_the_surfaces_names(
    limits: LimitsConfig, prompt: str, max_new: int, etype: str, param: str,
) -> None:
    async def main() -> None:
        with served(limits) as model:
            with pytest.raises(ApiError) as err:
                await fake_surface(model, RequestContext("r"), [prompt], max_new=max_new)
            assert err.value.type == etype and err.value.param == param
            assert model.engine.engine.stats.snapshot()["requests_finished"] == 0  # refused before any work

    asyncio.run(main())


def test_the_byte_precheck_refuses_huge_text_untokenised() -> None:
    with served(LimitsConfig(max_prompt_tokens=8)) as model:
        with pytest.raises(ApiError) as err:
            check_text_bytes(model, "x" * 100, "prompt")  # the reference vocabulary: one byte per token
        assert err.value.type == "prompt_too_long" and "100 bytes" in err.value.message
        check_text_bytes(model, "x" * 7, "prompt")


def test_a_refusal_submits_nothing_and_leaves_nothing_queued() -> None:
    async def main() -> None:
        with served(max_waiting=2, n_slots=1, delay_s=0.002) as model:
            eng = model.engine.engine
            blocker = await fake_surface(model, RequestContext("a"), ["a"], max_new=200)
            await wait_for_async(lambda: eng.stats.snapshot()["running"] == 1)  # in its slot: the queue is empty
            with pytest.raises(ApiError) as err:
                await fake_surface(model, RequestContext("b"), ["b"], n=3, max_new=200)  # third run over the queue
            assert err.value.type == "overloaded" and err.value.retry_after is not None
            blocker.close()
            await wait_for_async(lambda: not eng.scheduler.has_work)  # the runs admitted before the refusal: aborted
            assert eng.stats.snapshot()["requests_cancelled"] == 3

    asyncio.run(main())


def test_silence_gives_a_heartbeat_cue_and_leaving_aborts() -> None:
    async def main() -> None:
        with served(delay_s=0.05, n_slots=1) as model:
            runs = await fake_surface(model, RequestContext("r"), ["ab"], max_new=200)
            events = runs.events(heartbeat_s=0.001)
            seen = [await anext(events) for _ in range(3)]
            assert None in seen  # 50 ms per step: the 1 ms timer fired before a token came
            await events.aclose()
            eng = model.engine.engine
            await wait_for_async(lambda: not eng.scheduler.has_work)
            assert eng.stats.snapshot()["requests_cancelled"] == 1

    asyncio.run(main())


def test_a_passed_deadline_is_a_typed_504() -> None:
    async def main() -> None:
        with served(delay_s=0.002) as model:
            ctx = RequestContext("r", deadline=time.monotonic() + 0.05)
            runs = await fake_surface(model, ctx, ["ab"], max_new=200)  # 200 steps of >= 2 ms cannot fit 50 ms
            with pytest.raises(ApiError) as err:
                await collect_finished(runs, ctx)
            assert err.value.type == "deadline_exceeded" and err.value.status == 504
            assert model.engine.engine.stats.snapshot()["requests_expired"] == 1

    asyncio.run(main())


def test_finish_reasons_pass_through_the_core() -> None:
    async def main() -> None:
        with served() as model:
            runs = await fake_surface(model, RequestContext("r"), ["ab"], max_new=3)
            (r,) = await runs.collect()
            assert r.final is not None and r.final.finish_reason is FinishReason.LENGTH
            assert r.final.completion_tokens == 3 == len(r.token_ids)

    asyncio.run(main())


def test_the_admission_hook_reserves_the_cost_before_the_engine_sees_anything() -> None:
    class Recorder:
        remote = False

        def __init__(self, refuse: bool) -> None:
            self.calls: list[tuple[int, str | None]] = []
            self.refuse = refuse

        async def reserve(self, cost: int, param: str | None = None) -> None:
            self.calls.append((cost, param))
            if self.refuse:
                raise ApiError("rate_limit_exceeded", "over the limit", retry_after=3)

    async def main() -> None:
        with served() as model:
            ok = Recorder(refuse=False)
            runs = await fake_surface(model, RequestContext("a"), ["abcd"], n=2, max_new=4, admission=Admission(ok))
            assert ok.calls == [(runs.cost, "max_new")] and runs.cost == 2 * (5 + 4)
            await runs.collect()
            no = Recorder(refuse=True)
            with pytest.raises(ApiError) as err:
                await fake_surface(model, RequestContext("b"), ["abcd"], max_new=4, admission=Admission(no))
            assert err.value.type == "rate_limit_exceeded" and no.calls == [(9, "max_new")]
            assert model.engine.engine.stats.snapshot()["requests_finished"] == 2  # the refused one never ran

    asyncio.run(main())


class Reservation:
    """An admission whose reservation, once started, waits for `go` from the gate."""

    remote = True  # a round trip: overlapped with the gate's

    def __init__(self, refuse: bool = False) -> None:
        self.started = asyncio.Event()
        self.go = asyncio.Event()
        self.refuse = refuse
        self.reserved = self.cancelled = False

    async def reserve(self, cost: int, param: str | None = None) -> None:
        self.started.set()
        await self.go.wait()
        if self.refuse:
            raise ApiError("rate_limit_exceeded", "over the limit", retry_after=3)
        self.reserved = True

    async def cancel(self) -> None:
        self.cancelled = self.reserved


@pytest.mark.parametrize(("gate_refuses", "limit_refuses", "raised"), [
    (False, False, None),
    (False, True, "rate_limit_exceeded"),
    (True, False, "idempotency_key_in_use"),  # the gate's answer wins, and the reservation is given back
    (True, True, "idempotency_key_in_use"),
])
def test_admit_runs_the_reservation_and_the_gate_at_once(gate_refuses: bool, limit_refuses: bool,
                                                         raised: str | None) -> None:
    limit = Reservation(refuse=limit_refuses)

    async def gate() -> None:
        await limit.started.wait()  # each waits for the other: run one after the other, they never end
        limit.go.set()
        if gate_refuses:
            raise ApiError("idempotency_key_in_use", "still running", retry_after=1)

    async def main() -> str | None:
        ctx = RequestContext("a")
        try:
            await asyncio.wait_for(Admission(limit, gate).admit(ctx, 10, "max_tokens"), 60)
        except ApiError as exc:
            return exc.type
        return None

    assert asyncio.run(main()) == raised
    assert limit.cancelled == (gate_refuses and not limit_refuses)


@pytest.mark.parametrize("gate_refuses", [False, True])
def test_admit_with_a_local_limiter_passes_the_gate_first_and_reserves_only_for_work(gate_refuses: bool) -> None:
    order: list[str] = []

    class Local:
        remote = False

        async def reserve(self, cost: int, param: str | None = None) -> None:
            order.append("reserve")

        async def cancel(self) -> None:
            order.append("cancel")

    async def gate() -> None:
        order.append("gate")
        if gate_refuses:
            raise ApiError("idempotency_key_reused", "another request")

    async def main() -> None:
        ctx = RequestContext("a")
        with pytest.raises(ApiError) if gate_refuses else contextlib.nullcontext():
            await Admission(Local(), gate).admit(ctx, 10, "max_tokens")

    asyncio.run(main())
    assert order == (["gate"] if gate_refuses else ["gate", "reserve"])


def test_start_lifts_a_clients_refusal_as_the_serving_layers_error() -> None:
    """An engine client beside the serving layer (an upstream's) refuses with `Rejected`, no HTTP in it:
    `Runs.start` lifts it to ApiError with the same fields, as it maps the local engine's refusals."""

    class Refusing:
        def submit(self, requests: object) -> OutputCollector:
            raise Rejected("upstream_unavailable", "every upstream is failing", code="circuit_open", retry_after=3)

        def abort(self, request_id: str) -> None:
            raise AssertionError("nothing was submitted")

    with pytest.raises(ApiError) as caught:
        Runs(Refusing(), [], 0).start()
    err = caught.value
    assert (err.type, err.message, err.code, err.retry_after, err.headers) == (
        "upstream_unavailable", "every upstream is failing", "circuit_open", 3, {})
