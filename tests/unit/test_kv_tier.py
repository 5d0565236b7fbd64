"""The host-memory KV tier: its budget and LRU, the slot table's save and restore ops, and the engine on the
reference backend (outputs never depend on the tier; an abort racing a restore frees everything)."""

from __future__ import annotations

import random

import numpy as np
import pytest

from sluicegate.backends.base import BatchItem
from sluicegate.backends.reference import ReferenceRunner
from sluicegate.engine import Engine, FinishReason, SchedulerConfig
from sluicegate.engine.kv_tier import KvTier, default_budget
from sluicegate.engine.prefix_cache import KvOp, SlotTable
from sluicegate.testing.wait import wait_for
from tests.unit.test_engine import Collector, engine, req, run


def _common(a: tuple[int, ...], b: list[int]) -> int:
    k = 0
    while k < min(len(a), len(b)) and a[k] == b[k]:
        k += 1
    return k


def test_the_budget_is_never_exceeded_and_the_least_recently_used_goes_first() -> None:
    tier = KvTier(1000)
    rng = random.Random(7)
    for i in range(300):
        tokens = [rng.randrange(4) for _ in range(rng.randrange(1, 12))]
        tier.put(tokens, bytes(rng.randrange(1, 400)))
        assert tier.bytes_held <= 1000
        probe = [rng.randrange(4) for _ in range(8)]
        longest = max((_common(k, probe) for k in tier._entries), default=0)  # brute force
        hit = tier.lookup(probe)
        assert (hit.shared if hit else 0) == longest
        assert tier.covers(probe[:3]) == any(k[:3] == tuple(probe[:3]) for k in tier._entries if len(k) >= 3)
        assert not any(a != b and b[: len(a)] == a for a in tier._entries for b in tier._entries)  # no prefix kept
        if hit is not None and i % 3 == 0:
            tier.touch(hit.key)
    assert tier.bytes_held == sum(len(tier.lookup(list(k)).snapshot) for k in list(tier._entries))  # type: ignore[union-attr]
    lru = KvTier(300)
    lru.put([1, 1], bytes(100))
    lru.put([2, 2], bytes(100))
    lru.put([3, 3], bytes(100))
    hit = lru.lookup([1, 1, 5])
    assert hit is not None and hit.shared == 2
    lru.touch(hit.key)
    lru.put([4, 4], bytes(100))  # drops [2, 2], the least recently used
    assert lru.lookup([2, 2]) is None and lru.lookup([1, 1]) is not None and lru.dropped == 1
    assert not lru.put([5], bytes(301)) and lru.bytes_held == 300  # larger than the whole budget: not kept


def test_lookup_finds_the_longest_prefix_and_covered_prefixes_are_not_kept_twice() -> None:
    tier = KvTier(10_000)
    tier.put([1, 2, 3], b"abc")
    tier.put([1, 2, 3, 4, 5], b"abcde")  # makes [1, 2, 3] redundant
    assert len(tier) == 1 and tier.bytes_held == 5
    assert not tier.put([1, 2], b"ab") and tier.covers([1, 2, 3, 4])
    tier.put([1, 9], b"xy")
    hit = tier.lookup([1, 2, 3, 4, 7, 7])
    assert hit is not None and (hit.shared, hit.snapshot) == (4, b"abcde")
    assert tier.lookup([2, 1]) is None and tier.lookup([]) is None
    with pytest.raises(ValueError):
        KvTier(-1)
    assert default_budget() > 0


def test_an_evicted_slot_is_saved_and_a_returning_prompt_restored_and_truncated() -> None:
    tier = KvTier(1 << 20)
    table = SlotTable(1, tier=tier)
    a = [1, *range(10, 30)]
    first = table.acquire(a)
    assert first is not None and first.ops == (KvOp("clear", 0),)
    table.record(0, a, len(a))
    table.release(0)
    b = [1, *range(50, 60)]
    second = table.acquire(b)  # evicts a's 21 tokens: saved first
    assert second is not None and second.ops[0] == KvOp("save", 0, len(a), tokens=tuple(a))
    tier.put(a, b"snapshot of a")  # what the engine does with the save op
    table.record(0, b, len(b))
    table.release(0)
    back = [*a[:15], 99, 98, 97]  # shares 15 tokens with the snapshot of 21
    third = table.acquire(back)
    assert third is not None and third.reused_tokens == 15
    assert third.ops[0].kind == "save" and third.ops[0].tokens == tuple(b)
    assert third.ops[1:] == (KvOp("restore", 0, snapshot=b"snapshot of a"), KvOp("truncate", 0, 15))
    assert table.tree.tokens(0) == back[:15] and (table.tier_hits, table.restored_tokens) == (1, 15)
    table.release(0)
    whole = table.acquire(a)  # the snapshot holds all of `a`: the last two tokens are still computed
    assert whole is not None and whole.reused_tokens == len(a) - 2


def test_a_slot_that_holds_the_longer_prefix_wins_over_the_tier_and_a_disabled_tier_is_ignored() -> None:
    tier = KvTier(1 << 20)
    tier.put([1, 2, 3, 4], b"short")
    table = SlotTable(2, tier=tier)
    p = [1, 2, 3, 4, 5, 6, 7, 8, 9]
    got = table.acquire(p)
    assert got is not None and got.ops[0].kind == "restore" and got.reused_tokens == 4
    table.record(got.slot, p, len(p))
    table.release(got.slot)
    again = table.acquire([*p, 10, 11])
    assert again is not None and again.reused_tokens == 9 and all(op.kind != "restore" for op in again.ops)
    assert SlotTable(1, tier=KvTier(0)).tier is None


def test_the_reference_runner_restores_a_snapshot_bit_for_bit() -> None:
    r = ReferenceRunner(n_slots=3)
    ids = [256, *b"a conversation so far"]
    r.execute([BatchItem(0, ids[:5], 0, False)])
    r.execute([BatchItem(0, ids[5:], 5, False)])
    snap = r.save(0, len(ids))
    r.restore(2, snap)
    probe = list(b" and then")
    want = r.execute([BatchItem(0, probe, len(ids), True)])[0].copy()
    assert np.array_equal(r.execute([BatchItem(2, probe, len(ids), True)])[0], want)
    r.restore(1, snap)
    r.truncate(1, 7)
    r.clear(2)
    cold = r.execute([BatchItem(2, ids[:7] + probe, 0, True)])[0].copy()
    assert np.array_equal(r.execute([BatchItem(1, probe, 7, True)])[0], cold)
    with pytest.raises(ValueError):
        r.restore(0, b"1234")


def _conversations(eng: Engine, n_conv: int, turns: int) -> tuple[list[list[int]], list[int]]:
    """`n_conv` conversations interleaved turn by turn (each turn waits for the previous to end): every
    reply's tokens, and each turn's cached prompt tokens."""
    history = [[256, *f"conversation {i} starts here with some words".encode()] for i in range(n_conv)]
    replies: list[list[int]] = []
    cached: list[int] = []
    for turn in range(turns):
        for i in range(n_conv):
            c = run(eng, req([*history[i], *f" turn {turn}".encode()], max_new_tokens=12, temperature=0.0))
            final = c.wait()
            history[i] = [*history[i], *f" turn {turn}".encode(), *c.tokens]
            replies.append(c.tokens)
            cached.append(final.cached_tokens)
    return replies, cached


def test_interleaved_conversations_on_two_slots_get_the_same_tokens_with_the_tier_as_without() -> None:
    with engine(SchedulerConfig(kv_cache_bytes=0), n_slots=2) as (eng, runner):
        without, cached_without = _conversations(eng, 5, 3)
        computed_without = runner.executed_tokens
    with engine(SchedulerConfig(kv_cache_bytes=1 << 20), n_slots=2) as (eng, runner):
        with_tier, cached_with = _conversations(eng, 5, 3)
        wait_for(lambda: eng.stats.snapshot()["kv_tier_hits"] >= 5)
        snap = eng.stats.snapshot()
        assert 0 < snap["kv_tier_bytes"] <= 1 << 20 and snap["kv_tier_saves"] > 0
        assert eng.kv_tier.bytes_held <= eng.kv_tier.budget_bytes
        assert runner.executed_tokens < computed_without
        restores = eng.metrics.registry.get_sample_value("sluicegate_kv_tier_restore_seconds_count",
                                                         {"model_name": "reference"})
        assert restores == snap["kv_tier_hits"]
    assert with_tier == without
    assert sum(cached_with) > sum(cached_without)  # usage counts restored tokens as cached


def test_a_small_budget_keeps_the_tier_within_it_and_outputs_unchanged() -> None:
    with engine(SchedulerConfig(kv_cache_bytes=0), n_slots=2) as (eng, _):
        without, _ = _conversations(eng, 4, 2)
    budget = 300  # the reference snapshot is 5 bytes a token: about one conversation
    with engine(SchedulerConfig(kv_cache_bytes=budget), n_slots=2) as (eng, _):
        seen: list[int] = []
        put = eng.kv_tier.put

        def spy(tokens: object, snapshot: bytes) -> bool:
            kept = put(tokens, snapshot)  # type: ignore[arg-type]
            seen.append(eng.kv_tier.bytes_held)
            return kept

        eng.kv_tier.put = spy  # type: ignore[method-assign]
        with_tier, _ = _conversations(eng, 4, 2)
        assert seen and max(seen) <= budget and eng.kv_tier.dropped > 0
    assert with_tier == without


def test_an_abort_racing_a_restore_frees_the_slot_and_the_conversation_still_continues_exactly() -> None:
    cfg = SchedulerConfig(kv_cache_bytes=1 << 20, max_batch_tokens=16, min_prefill_chunk=4)
    a = [256, *b"the first conversation, long enough to be worth restoring"]
    follow = [*a, *b" next"]
    with engine(SchedulerConfig(kv_cache_bytes=0), n_slots=1) as (eng, _):
        want = run(eng, req(follow, max_new_tokens=8, temperature=0.0))
        want.wait()
    with engine(cfg, n_slots=1) as (eng, runner):
        run(eng, req(a, max_new_tokens=4, temperature=0.0)).wait()
        run(eng, req([256, *b"another one takes the slot"], max_new_tokens=4, temperature=0.0)).wait()
        wait_for(lambda: len(eng.kv_tier) == 1)
        runner.gated = True
        entered = runner.entered
        victim = Collector()
        victim_req = req(follow, max_new_tokens=50, temperature=0.0, ignore_eos=True)
        eng.submit(victim_req, victim)
        wait_for(lambda: runner.entered > entered)  # the restore is applied; its first chunk waits in the runner
        assert eng.scheduler.slots.tier_hits == 1
        eng.abort(victim_req.request_id)
        runner.gated = False
        runner.release(1000)
        assert victim.wait().finish_reason is FinishReason.CANCELLED
        wait_for(lambda: not eng.scheduler.has_work)
        assert eng.scheduler.slots.n_busy == 0 and eng.stats.snapshot()["running"] == 0
        assert eng.kv_tier.bytes_held <= eng.kv_tier.budget_bytes
        again = run(eng, req(follow, max_new_tokens=8, temperature=0.0))
        again.wait()
        assert again.tokens == want.tokens
