"""The slot table and prefix cache: token-granular reuse in place or by copy, eviction, what is never reused."""

from __future__ import annotations

import pytest

from sluicegate.engine.prefix_cache import KvOp, SlotTable


def ids(n: int, start: int = 0) -> list[int]:
    return list(range(start, start + n))


def served(t: SlotTable, prompt: list[int], computed: int | None = None, *, keep_cache: bool = True) -> int:
    """A request for `prompt` takes a slot, prefills `computed` tokens of it (all), and leaves; returns the slot."""
    a = t.acquire(prompt)
    assert a is not None
    t.record(a.slot, prompt, len(prompt) if computed is None else computed)
    t.release(a.slot, keep_cache=keep_cache)
    return a.slot


def test_first_acquisitions_take_empty_slots_lowest_first() -> None:
    t = SlotTable(3)
    got = [t.acquire(ids(5)) for _ in range(3)]
    assert [a.slot for a in got if a] == [0, 1, 2]
    assert all(a is not None and a.ops == (KvOp("clear", a.slot),) and a.reused_tokens == 0 for a in got)
    assert t.acquire(ids(5)) is None and t.n_free == 0
    assert t.lookups == 3 and t.hits == 0


@pytest.mark.parametrize("shared", [1, 2, 3, 17, 63, 64, 65, 130])
def test_any_common_prefix_is_reused(shared: int) -> None:
    t = SlotTable(1)
    first = ids(200)
    slot = served(t, first)
    prompt = [*first[:shared], 9000, 9001, 9002]
    a = t.acquire(prompt)
    assert a is not None and a.slot == slot and a.reused_tokens == shared
    assert a.ops == (KvOp("truncate", slot, shared),)
    assert t.hits == 1 and t.reused_tokens == shared
    assert t.tree.tokens(slot) == first[:shared] and t.evictions == 200 - shared
    t.release(slot)
    # with a second slot free, the cached tail is kept: the prefix is copied into the empty slot instead
    t2 = SlotTable(2)
    s2 = served(t2, first)
    b = t2.acquire(prompt)
    assert b is not None and b.slot != s2 and b.reused_tokens == shared
    assert b.ops == (KvOp("copy", b.slot, s2), KvOp("truncate", b.slot, shared)) and t2.evictions == 0


@pytest.mark.parametrize("n", [1, 2, 3, 4, 9, 64])
def test_reuse_leaves_the_last_two_prompt_tokens_to_compute(n: int) -> None:
    t = SlotTable(1)
    prompt = ids(n)
    served(t, prompt)
    again = t.acquire(prompt)
    assert again is not None and again.reused_tokens == max(n - 2, 0)


def test_granularity_rounds_the_reuse_down() -> None:
    t = SlotTable(1, granularity=16)
    served(t, ids(100))
    a = t.acquire([*ids(40), 7, 7])
    assert a is not None and a.reused_tokens == 32


def test_reuse_from_a_busy_slot_copies_into_a_free_one() -> None:
    t = SlotTable(3)
    prompt = ids(10)
    a = t.acquire(prompt)
    assert a is not None
    t.record(a.slot, prompt, 10)  # still busy
    b = t.acquire([*ids(7), 77, 78, 79])
    assert b is not None and b.slot != a.slot and b.reused_tokens == 7
    assert b.ops == (KvOp("copy", b.slot, a.slot), KvOp("truncate", b.slot, 7))
    assert t.tree.tokens(b.slot) == ids(7)


def test_a_reused_slot_that_would_lose_its_own_tokens_is_copied_from_instead() -> None:
    # a conversation's history in slot 0; another conversation shares only its system prompt
    t = SlotTable(2)
    system = ids(30)
    history = [*system, *ids(50, start=500)]
    s0 = served(t, history)
    other = [*system, *ids(8, start=900)]
    a = t.acquire(other)
    assert a is not None and a.slot != s0 and a.reused_tokens == 30
    assert a.ops == (KvOp("copy", a.slot, s0), KvOp("truncate", a.slot, 30))
    assert t.evictions == 0 and t.tree.tokens(s0) == history  # the history is still whole


def test_a_repeated_prompt_is_reused_in_place_even_with_empty_slots() -> None:
    t = SlotTable(3)
    prompt = ids(40)
    slot = served(t, prompt)
    a = t.acquire(prompt)  # the two tokens truncated are recomputed by this very request: nothing is lost
    assert a is not None and a.slot == slot and a.ops == (KvOp("truncate", slot, 38),)


def test_a_free_slot_wins_a_tie_over_a_busy_one() -> None:
    t = SlotTable(3)
    prompt = ids(9)
    busy = t.acquire(prompt)
    cached = t.acquire(prompt)
    assert busy is not None and cached is not None
    for a in (busy, cached):
        t.record(a.slot, prompt, 9)
    t.release(cached.slot)
    again = t.acquire(prompt)
    assert again is not None and again.slot == cached.slot and again.ops[0].kind == "truncate"


def test_eviction_prefers_slots_whose_tokens_survive_then_least_recently_used() -> None:
    t = SlotTable(4)
    prompts = [ids(8, start=100 * k) for k in range(3)]
    s0, s1 = served(t, prompts[0]), served(t, prompts[1])
    a = t.acquire(prompts[2])
    assert a is not None
    t.record(a.slot, prompts[2], 8)
    b = t.acquire(prompts[2])  # same prompt while the first is busy: copied into the empty slot
    assert b is not None and b.ops == (KvOp("copy", b.slot, a.slot), KvOp("truncate", b.slot, 6))
    t.record(b.slot, prompts[2], 8)
    t.release(b.slot)
    t.release(a.slot)
    # slots a and b hold the same tokens: taking one of them evicts nothing, whatever the LRU order
    fresh = t.acquire(ids(8, start=900))
    assert fresh is not None and fresh.slot == a.slot and fresh.ops == (KvOp("clear", a.slot),)
    assert t.evictions == 0
    t.record(fresh.slot, ids(8, start=900), 8)
    t.release(fresh.slot)
    # now every free slot would lose its tokens (and none is busy, so none widens the busy span): the least
    # recently used one goes
    other = t.acquire(ids(8, start=950))
    assert other is not None and other.slot == s0 and t.evictions == 8
    hit = t.acquire(prompts[1])  # the other prompts are still cached
    assert hit is not None and hit.slot == s1 and hit.reused_tokens == 6


def test_a_request_takes_a_slot_next_to_the_busy_ones_before_an_empty_one_further_away() -> None:
    # a step computes attention over every slot from the lowest busy one to the highest: a slot outside that
    # span costs every sequence in it, an evicted prefix only one prefill
    t = SlotTable(5)
    taken = [t.acquire(ids(8, start=100 * k)) for k in range(4)]
    for a in taken:
        assert a is not None
        t.record(a.slot, ids(8, start=100 * a.slot), 8)
    assert [a.slot for a in taken if a] == [0, 1, 2, 3]
    for slot in (1, 2, 3):  # slot 0 stays busy; 1-3 keep their prompts cached; 4 is empty
        t.release(slot)
    near = t.acquire(ids(8, start=950))  # slot 4 is empty, but a step over slots 0-4 costs five slots
    assert near is not None and near.slot == 1 and t.evictions == 8
    hit = t.acquire(ids(8, start=100 * 2))  # slot 2 next to the span holds this prefix: reused in place
    assert hit is not None and hit.slot == 2 and hit.reused_tokens == 6
    far = t.acquire(ids(8, start=100 * 3))  # ... and slot 3 this one
    assert far is not None and far.slot == 3 and far.reused_tokens == 6


def test_a_request_joins_two_runs_of_busy_slots_before_it_extends_one() -> None:
    # each run of adjacent busy slots is its own micro-batch in llama.cpp: a pass over the weights each
    t = SlotTable(8)
    for _ in range(6):
        assert t.acquire(ids(8, start=700)) is not None  # slots 0-5
    t.release(2)
    t.release(3)  # busy: 0-1 and 4-5
    first = t.acquire(ids(8, start=800))
    assert first is not None and first.slot == 2  # extends 0-1 (as 3 or 6 would), inside the busy span
    second = t.acquire(ids(8, start=900))
    assert second is not None and second.slot == 3  # joins 0-2 and 4-5 into one run


def test_a_request_extends_a_run_rather_than_start_one_between_two() -> None:
    t = SlotTable(8)
    for k in range(6):
        a = t.acquire(ids(8, start=100 * k))
        assert a is not None and a.slot == k
        t.record(k, ids(8, start=100 * k), 8)
    for slot in (1, 4):
        t.release(slot)  # cached
    for slot in (2, 3):
        t.release(slot, keep_cache=False)  # empty
    # busy: 0 and 5; slots 2 and 3 are empty but would be a third micro-batch: 1 or 4 (cached) extend a run
    a = t.acquire(ids(8, start=900))
    assert a is not None and a.slot in (1, 4) and t.evictions == 8


def test_a_burst_after_a_busy_spell_takes_adjacent_slots() -> None:
    t = SlotTable(16)
    for k in range(16):  # every slot holds a prompt of its own, released in an order spread about the table
        a = t.acquire(ids(8, start=100 * k))
        assert a is not None and a.slot == k
        t.record(k, ids(8, start=100 * k), 8)
    for k in range(16):
        t.release((k * 7) % 16)
    slots = []
    for k in range(6):
        a = t.acquire(ids(8, start=5000 + 100 * k))
        assert a is not None
        slots.append(a.slot)
    assert max(slots) - min(slots) == 5, slots


def test_busy_slots_are_never_evicted() -> None:
    t = SlotTable(2)
    a = t.acquire(ids(20))
    assert a is not None
    t.record(a.slot, ids(20), 20)
    b = t.acquire(ids(20, start=300))
    assert b is not None and b.slot != a.slot
    assert t.acquire(ids(5)) is None
    assert t.tree.tokens(a.slot) == ids(20) and t.evictions == 0


def test_recording_extends_the_path_token_by_token() -> None:
    t = SlotTable(2)
    prompt = ids(14)
    a = t.acquire(prompt)
    assert a is not None
    t.record(a.slot, prompt, 6)
    assert t.n_cached(a.slot) == 6
    t.record(a.slot, prompt, 13)
    assert t.tree.tokens(a.slot) == prompt[:13]
    t.release(a.slot)
    b = t.acquire([*prompt, 60, 61, 62])
    assert b is not None and b.reused_tokens == 13


def test_failed_slots_drop_their_cache() -> None:
    t = SlotTable(1)
    served(t, ids(9), keep_cache=False)
    assert t.cached_tokens == 0
    again = t.acquire(ids(9))
    assert again is not None and again.reused_tokens == 0 and again.ops == (KvOp("clear", 0),)


def test_a_slot_keeps_only_tokens_it_computed() -> None:
    t = SlotTable(1)
    served(t, ids(12), 5)  # prefill stopped after five tokens (cancelled)
    assert t.cached_tokens == 5


def test_bad_sizes_are_refused() -> None:
    with pytest.raises(ValueError):
        SlotTable(0)
    with pytest.raises(ValueError):
        SlotTable(2, granularity=0)
