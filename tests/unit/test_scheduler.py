"""The scheduler alone, driven with fake sampled tokens: no model, no threads, no clock."""

from __future__ import annotations

import random
from itertools import count

import pytest

from sluicegate.engine.scheduler import Scheduler, SchedulerConfig, SchedulerOutput, Seq, SeqStatus
from sluicegate.engine.types import EngineRequest, FinishReason, Priority, SamplingParams

EOS = 999
_ids = count()


def seq(
    prompt_len: int, max_new: int = 4, *, tenant: str = "", priority: Priority = Priority.INTERACTIVE,
    arrival: float = 0.0, deadline: float | None = None, start: int = 0,
) -> Seq:
    req = EngineRequest(
        f"r{next(_ids)}", list(range(start, start + prompt_len)), SamplingParams(max_new_tokens=max_new),
        arrival=arrival, priority=priority, tenant=tenant, deadline=deadline,
    )
    return Seq(request=req, seed=0)


def make(n_slots: int = 4, **cfg: int | float) -> Scheduler:
    # prompts here share their first tokens: no prefix reuse unless a test asks for it with a block size
    cfg.setdefault("block_size", 1 << 20)
    return Scheduler(SchedulerConfig(**cfg), n_slots, frozenset({EOS}))  # type: ignore[arg-type]


def step(s: Scheduler, now: float = 1.0, token: int = 5) -> SchedulerOutput:
    out = s.schedule(now)
    s.update(out, [token for c in out.chunks if c.want_logits], now)
    return out


def check_invariants(s: Scheduler) -> None:
    busy = [q.slot for q in s.running]
    assert len(busy) == len(set(busy)) == s.slots.n_busy
    assert all(q.status is SeqStatus.RUNNING for q in s.running)
    assert all(q.status is SeqStatus.WAITING and q.slot is None for q in s.waiting)
    assert s.waiting_tokens == sum(q.prompt_len for q in s.waiting)


def test_every_running_sequence_decodes_every_step_before_any_prompt_chunk() -> None:
    s = make(n_slots=3, max_batch_tokens=64)
    a, b = seq(10, max_new=50), seq(10, max_new=50)
    s.add(a)
    s.add(b)
    step(s)  # both prompts fit one step
    assert not a.in_prefill and not b.in_prefill and len(a.output_ids) == 1
    c = seq(200)
    s.add(c)
    for _ in range(4):
        out = step(s)
        kinds = [(ch.seq, len(ch.token_ids)) for ch in out.chunks]
        assert kinds[:2] == [(a, 1), (b, 1)]  # decode tokens first
        assert sum(n for _, n in kinds) <= 64
        check_invariants(s)
    assert len(a.output_ids) == len(b.output_ids) == 5


def test_a_long_prompt_is_prefilled_in_chunks_that_continue_each_other() -> None:
    s = make(n_slots=2, max_batch_tokens=64)
    runner_up = seq(3, max_new=100)
    s.add(runner_up)
    step(s)
    long = seq(300, max_new=2)
    s.add(long)
    positions: list[tuple[int, int]] = []
    while long.in_prefill:
        out = step(s)
        assert any(c.seq is runner_up for c in out.chunks)  # the running stream is never stalled
        positions += [(c.start_pos, len(c.token_ids)) for c in out.chunks if c.seq is long]
    starts = [p for p, _ in positions]
    assert starts[0] == 0 and all(p + n == q for (p, n), q in zip(positions, starts[1:], strict=False))
    assert sum(n for _, n in positions) == 300
    assert all(n == 63 for _, n in positions[:-1])  # 64-token budget minus the running stream's token
    assert long.output_ids == [5]  # logits only at the prompt's last chunk


def test_no_prompt_chunk_is_a_single_token() -> None:
    s = make(n_slots=3, max_batch_tokens=64, min_prefill_chunk=1)
    runner_up = seq(3, max_new=100)
    s.add(runner_up)
    step(s)
    q = seq(64)  # 63 tokens of budget would leave exactly one behind
    s.add(q)
    sizes = []
    while q.in_prefill:
        sizes += [len(c.token_ids) for c in step(s).chunks if c.seq is q]
    assert sizes == [62, 2]
    lone = seq(1)  # a one-token prompt can only be computed as one token
    s.add(lone)
    assert [len(c.token_ids) for c in step(s).chunks if c.seq is lone] == [1]


def test_only_the_last_chunk_of_a_prompt_asks_for_logits() -> None:
    s = make(n_slots=1, max_batch_tokens=32)
    q = seq(70)
    s.add(q)
    wants = [c.want_logits for _ in range(3) for c in step(s).chunks]
    assert wants == [False, False, True]


def test_a_request_waits_for_a_free_slot_and_takes_it_the_step_it_frees() -> None:
    s = make(n_slots=2)
    a, b, c = seq(5, max_new=2), seq(5, max_new=3), seq(5)
    for q in (a, b, c):
        s.add(q)
    step(s)
    assert c.status is SeqStatus.WAITING and s.slots.n_free == 0
    step(s)  # a reaches its length: its slot frees at once
    assert a.status is SeqStatus.FINISHED and a.finish_reason is FinishReason.LENGTH
    out = step(s)
    assert c.status is SeqStatus.RUNNING and c.slot == a.slot
    assert any(ch.seq is c for ch in out.chunks)
    check_invariants(s)


def test_small_leftover_budget_does_not_start_a_prompt() -> None:
    s = make(n_slots=3, max_batch_tokens=40, min_prefill_chunk=16)
    decoder = seq(2, max_new=50)
    s.add(decoder)
    step(s)
    long = seq(69)
    s.add(long)
    step(s)  # 1 decode token + 39 prompt tokens: 30 left
    late = seq(40)
    s.add(late)
    out = step(s)  # 1 + 30 leaves 9 < 16: the late prompt waits rather than start with 9 tokens
    assert late.status is SeqStatus.WAITING and not long.in_prefill
    assert sum(len(c.token_ids) for c in out.chunks) == 31
    out = step(s)
    assert [len(c.token_ids) for c in out.chunks if c.seq is late] == [38]  # 40 - 2 decode tokens


def test_eos_ends_a_sequence_unless_ignored() -> None:
    s = make()
    a = seq(3, max_new=10)
    s.add(a)
    step(s, token=EOS)
    assert a.finish_reason is FinishReason.EOS and s.slots.n_busy == 0
    b = seq(3, max_new=2)
    b.request.params = SamplingParams(max_new_tokens=2, ignore_eos=True)
    s.add(b)
    step(s, token=EOS)
    step(s, token=EOS)
    assert b.finish_reason is FinishReason.LENGTH and b.output_ids == [EOS, EOS]


def test_waiting_queue_bounds_requests_and_tokens() -> None:
    s = make(max_waiting=2, max_waiting_tokens=100)
    assert s.has_room(100)
    assert not s.has_room(101)
    s.add(seq(60))
    assert s.has_room(40) and not s.has_room(41)
    assert not s.has_room(10, extra_requests=1)  # the engine's inbox counts too
    assert not s.has_room(10, extra_tokens=31)
    s.add(seq(10))
    assert not s.has_room(1)


def test_interactive_requests_go_before_batch_ones_however_long_they_waited() -> None:
    s = make(n_slots=1, batch_aging_s=10.0)
    old_batch = seq(4, priority=Priority.BATCH, arrival=0.0)
    s.add(old_batch)
    newer = seq(4, arrival=1.0)
    s.add(newer)
    step(s, now=2.0)
    assert newer.status is SeqStatus.RUNNING and old_batch.status is SeqStatus.WAITING
    s.finish(newer, FinishReason.CANCELLED, 2.0)
    fresh = seq(4, arrival=100.0)
    s.add(fresh)
    step(s, now=100.0)  # the batch request has waited 100 s, far past its aging: it is still not promoted
    assert fresh.status is SeqStatus.RUNNING and old_batch.status is SeqStatus.WAITING


def test_an_interactive_prompt_prefills_while_batch_sequences_sit_the_step_out() -> None:
    s = make(n_slots=4, max_batch_tokens=64)
    jobs = [seq(6, max_new=100, priority=Priority.BATCH) for _ in range(2)]
    for q in jobs:
        s.add(q)
    step(s)
    chat = seq(10, max_new=5)
    s.add(chat)
    out = step(s)  # the arrival's prefill alone: its first token does not wait for the batch rows
    assert [c.seq for c in out.chunks] == [chat] and len(chat.output_ids) == 1
    assert all(len(q.output_ids) == 1 for q in jobs)
    out = step(s)  # and then everyone decodes again
    assert {c.seq for c in out.chunks} == {chat, *jobs}
    late = seq(10, max_new=5, priority=Priority.BATCH)
    s.add(late)
    out = step(s)  # a batch arrival does not hold anyone back
    assert {c.seq for c in out.chunks} == {chat, late, *jobs}


def test_batch_sequences_sit_out_at_most_every_other_step() -> None:
    s = make(n_slots=8, max_batch_tokens=64)
    job = seq(6, max_new=1000, priority=Priority.BATCH)
    s.add(job)
    step(s)
    for i in range(6):  # an interactive arrival before every step
        s.add(seq(10, max_new=1000, arrival=float(i)))
        out = step(s)
        assert (job in {c.seq for c in out.chunks}) == (i % 2 == 1)
    assert len(job.output_ids) == 4


def test_batch_requests_age_among_themselves() -> None:
    s = make(n_slots=2, batch_aging_s=10.0)
    busy = seq(4, max_new=500, priority=Priority.BATCH, tenant="b", arrival=0.0)
    s.add(busy)
    step(s, now=0.0)  # tenant b holds one slot from now on
    old_b = seq(4, priority=Priority.BATCH, tenant="b", arrival=0.0)
    young_a = seq(4, priority=Priority.BATCH, tenant="a", arrival=19.0)
    s.add(old_b)
    s.add(young_a)
    step(s, now=20.0)  # without aging tenant a (nothing running) would go first; old_b has aged past 10 s
    assert old_b.status is SeqStatus.RUNNING and young_a.status is SeqStatus.WAITING


def test_a_tenant_with_many_requests_does_not_starve_another() -> None:
    s = make(n_slots=2)
    flood = [seq(4, max_new=n, tenant="a", arrival=0.0) for n in (2, 50, 3, 3, 3, 3, 3, 3, 3, 3)]
    for q in flood:
        s.add(q)
    step(s)
    lone = seq(4, max_new=3, tenant="b", arrival=1.0)
    s.add(lone)
    while lone.status is SeqStatus.WAITING:
        step(s)
    # tenant b got the first slot that freed, ahead of tenant a's eight older requests
    assert sum(q.status is not SeqStatus.WAITING for q in flood) == 2


def test_same_class_same_tenant_is_first_come_first_served() -> None:
    s = make(n_slots=1)
    qs = [seq(3, max_new=1, arrival=float(i)) for i in range(5)]
    for q in reversed(qs):
        s.add(q)
    order = []
    while s.has_work:
        out = step(s, now=10.0)
        order += [c.seq for c in out.chunks if c.start_pos == 0]
    assert order == qs


@pytest.mark.parametrize("phase", ["waiting", "prefill", "decode"])
def test_cancellation_in_each_phase_frees_everything_at_once(phase: str) -> None:
    s = make(n_slots=1, max_batch_tokens=32)
    blocker = seq(3, max_new=100)
    victim = seq(100, max_new=100)
    if phase == "waiting":
        s.add(blocker)
        step(s)
    s.add(victim)
    step(s)
    if phase == "decode":
        while victim.in_prefill:
            step(s)
        step(s)
        assert len(victim.output_ids) == 2
    expected = SeqStatus.WAITING if phase == "waiting" else SeqStatus.RUNNING
    assert victim.status is expected and (phase != "prefill" or victim.in_prefill)
    s.finish(victim, FinishReason.CANCELLED, 2.0)
    assert victim.status is SeqStatus.FINISHED and victim.finish_reason is FinishReason.CANCELLED
    assert victim not in s.running and victim not in s.waiting
    check_invariants(s)
    assert s.slots.n_busy == (1 if phase == "waiting" else 0)
    out = step(s)
    assert all(c.seq is not victim for c in out.chunks)
    s.finish(victim, FinishReason.CANCELLED, 2.0)  # finishing twice is harmless


@pytest.mark.parametrize("phase", ["waiting", "prefill", "decode"])
def test_a_deadline_cancels_in_each_phase_on_the_next_step(phase: str) -> None:
    s = make(n_slots=1, max_batch_tokens=32)
    if phase == "waiting":
        s.add(seq(3, max_new=100))
    victim = seq(100, max_new=100, deadline=5.0)
    s.add(victim)
    step(s, now=1.0)
    if phase == "decode":
        while victim.in_prefill:
            step(s, now=1.0)
    out = s.schedule(5.0)
    assert out.expired == [victim] and victim.finish_reason is FinishReason.EXPIRED
    assert all(c.seq is not victim for c in out.chunks)
    check_invariants(s)


def test_a_first_token_deadline_binds_only_until_the_first_token() -> None:
    s = make(n_slots=1, max_batch_tokens=32)
    waiting, streaming = seq(3, max_new=100), seq(3, max_new=100)
    waiting.request.first_token_deadline = streaming.request.first_token_deadline = 5.0
    s.add(streaming)
    step(s, now=1.0)  # a 3-token prompt: its first token comes with the first step
    assert streaming.output_ids and streaming.status is SeqStatus.RUNNING
    s.add(waiting)  # the slot is taken: it waits
    out = s.schedule(5.0)
    assert out.expired == [waiting] and waiting.finish_reason is FinishReason.EXPIRED
    assert streaming.status is SeqStatus.RUNNING  # past its first token, that deadline no longer applies
    check_invariants(s)


def test_cancelled_prefill_keeps_only_completed_tokens_in_the_cache() -> None:
    s = make(n_slots=1, max_batch_tokens=100, block_size=1)
    q = seq(300)
    s.add(q)
    step(s)  # 100 tokens computed
    s.finish(q, FinishReason.CANCELLED, 1.0)
    assert s.slots.cached_tokens == 100
    again = seq(300)
    s.add(again)
    step(s)
    assert again.cached_tokens == 100 and again.num_computed == 100 + 100


def test_a_one_token_prompt_is_never_cached() -> None:
    s = make(n_slots=1, block_size=1)
    one = seq(1, max_new=2)
    s.add(one)
    while s.has_work:
        step(s)
    assert s.slots.cached_tokens == 0  # computed as one token: its KV is not what a prompt chunk computes
    two = seq(2, max_new=2)
    s.add(two)
    while s.has_work:
        step(s)
    assert s.slots.cached_tokens == 2


def test_prefix_reuse_sets_cached_tokens_and_kv_ops() -> None:
    s = make(n_slots=2, block_size=16)
    first = seq(40, max_new=1)
    s.add(first)
    step(s)
    assert first.status is SeqStatus.FINISHED
    second = seq(40, max_new=1)
    s.add(second)
    out = s.schedule(1.0)
    assert second.cached_tokens == 32 and out.kv_ops[0].kind == "truncate"
    assert [(c.start_pos, len(c.token_ids)) for c in out.chunks] == [(32, 8)]


def test_no_sequence_starves_under_random_load() -> None:
    rng = random.Random(3)
    s = make(n_slots=4, max_batch_tokens=96, block_size=16)
    all_seqs: list[Seq] = []
    now = 0.0
    for t in range(400):
        now = float(t)
        if t < 200 and rng.random() < 0.4:
            q = seq(rng.randint(1, 150), max_new=rng.randint(1, 30), tenant=rng.choice("abc"), arrival=now,
                    priority=rng.choice([Priority.INTERACTIVE, Priority.BATCH]), start=rng.choice([0, 1000]))
            s.add(q)
            all_seqs.append(q)
        if rng.random() < 0.02 and s.running:
            s.finish(rng.choice(s.running), FinishReason.CANCELLED, now)
        out = step(s, now=now, token=rng.choice([5, 6, 7]))
        assert all(len(c.token_ids) >= 2 or c.start_pos >= c.seq.prompt_len - 1 for c in out.chunks)
        assert all(len(c.token_ids) >= 2 for c in out.chunks if c.start_pos < c.seq.prompt_len > 1)
        check_invariants(s)
    assert not s.has_work
    assert all(q.status is SeqStatus.FINISHED for q in all_seqs)
    finished_ok = [q for q in all_seqs if q.finish_reason is FinishReason.LENGTH]
    assert all(len(q.output_ids) == q.request.params.max_new_tokens for q in finished_ok)
    assert s.slots.hits > 0  # shared starts were reused


def test_config_must_hold_a_token_per_slot() -> None:
    with pytest.raises(ValueError):
        Scheduler(SchedulerConfig(max_batch_tokens=8, min_prefill_chunk=4), 16, frozenset())


def test_empty_prompts_are_refused() -> None:
    with pytest.raises(ValueError):
        make().add(seq(0))
