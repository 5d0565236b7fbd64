"""The slot table and prefix cache: hash-chained blocks, reuse in place or by copy, LRU eviction."""

from __future__ import annotations

import pytest

from sluicegate.engine.prefix_cache import KvOp, SlotTable, block_keys

B = 4  # block size used throughout


def ids(n: int, start: int = 0) -> list[int]:
    return list(range(start, start + n))


def served(t: SlotTable, prompt: list[int], computed: int, *, keep_cache: bool = True) -> int:
    """A request for `prompt` takes a slot, prefills `computed` tokens of it, and leaves; returns the slot."""
    a = t.acquire(prompt)
    assert a is not None
    t.record(a.slot, prompt, computed)
    t.release(a.slot, keep_cache=keep_cache)
    return a.slot


def test_block_keys_chain_covers_every_token_before() -> None:
    a = block_keys(ids(12), B)
    assert len(a) == 3 and len(set(a)) == 3
    assert block_keys(ids(13), B) == a  # a partial block has no key
    changed = ids(12)
    changed[1] = 99  # a change in block 0 changes every later key
    assert all(x != y for x, y in zip(a, block_keys(changed, B), strict=True))
    later = ids(12)
    later[9] = 99  # a change in block 2 keeps blocks 0 and 1
    assert block_keys(later, B)[:2] == a[:2] and block_keys(later, B)[2] != a[2]
    assert all(isinstance(k, bytes) and len(k) == 16 for k in a)  # BLAKE2b, not Python's hash


def test_block_keys_resume_from_a_previous_key() -> None:
    full = block_keys(ids(20), B)
    assert block_keys(ids(20), B, prev=full[1], start=2) == full[2:]


def test_first_acquisitions_take_empty_slots_lowest_first() -> None:
    t = SlotTable(3, B)
    got = [t.acquire(ids(5)) for _ in range(3)]
    assert [a.slot for a in got if a] == [0, 1, 2]
    assert all(a is not None and a.ops == (KvOp("clear", a.slot),) and a.reused_tokens == 0 for a in got)
    assert t.acquire(ids(5)) is None and t.n_free == 0
    assert t.lookups == 3 and t.hits == 0


def test_reuse_in_place_truncates_and_leaves_the_last_prompt_token() -> None:
    t = SlotTable(2, B)
    prompt = ids(8)  # exactly two blocks
    slot = served(t, prompt, 8)
    assert t.cached_blocks == 2
    again = t.acquire(prompt)
    # only one block is reused: the last prompt token must be computed for its logits
    assert again is not None and again.slot == slot and again.reused_tokens == B
    assert again.ops == (KvOp("truncate", slot, B),)
    assert t.hits == 1 and t.reused_tokens == B
    # the truncation forgot the second block; the busy slot still lends its first one
    longer = t.acquire([*prompt, 50, 51])
    assert longer is not None and longer.slot != slot and longer.reused_tokens == B
    assert longer.ops == (KvOp("copy", longer.slot, slot), KvOp("truncate", longer.slot, B))


def test_reuse_from_a_busy_slot_copies_into_a_free_one() -> None:
    t = SlotTable(3, B)
    prompt = ids(10)
    a = t.acquire(prompt)
    assert a is not None
    t.record(a.slot, prompt, 10)  # still busy
    b = t.acquire([*ids(8), 77, 78, 79])
    assert b is not None and b.slot != a.slot and b.reused_tokens == 2 * B
    assert b.ops == (KvOp("copy", b.slot, a.slot), KvOp("truncate", b.slot, 2 * B))
    assert t.keys(b.slot) == t.keys(a.slot)[:2]


def test_a_free_slot_wins_a_tie_over_a_busy_one() -> None:
    t = SlotTable(3, B)
    prompt = ids(9)
    busy = t.acquire(prompt)
    cached = t.acquire(prompt)
    assert busy is not None and cached is not None
    for a in (busy, cached):
        t.record(a.slot, prompt, 9)
    t.release(cached.slot)
    again = t.acquire(prompt)
    assert again is not None and again.slot == cached.slot and again.ops[0].kind == "truncate"


def test_eviction_prefers_empty_slots_then_least_recently_used() -> None:
    t = SlotTable(3, B)
    prompts = [ids(8, start=100 * k) for k in range(3)]
    slots = []
    for p in prompts:
        a = t.acquire(p)
        assert a is not None
        t.record(a.slot, p, 8)
        slots.append(a.slot)
    t.release(slots[1])  # released first: least recently used
    t.release(slots[0])
    t.release(slots[2])
    fresh = t.acquire(ids(8, start=900))
    assert fresh is not None and fresh.slot == slots[1] and fresh.ops == (KvOp("clear", slots[1]),)
    assert t.evictions == 2
    # the other two prompts are still cached
    hit = t.acquire(prompts[0])
    assert hit is not None and hit.slot == slots[0] and hit.reused_tokens == B


def test_recording_extends_the_chain_block_by_block() -> None:
    t = SlotTable(2, B)
    prompt = ids(14)
    a = t.acquire(prompt)
    assert a is not None
    t.record(a.slot, prompt, 6)
    assert t.n_blocks(a.slot) == 1
    t.record(a.slot, prompt, 13)
    assert t.keys(a.slot) == tuple(block_keys(prompt, B))
    t.release(a.slot)
    b = t.acquire([*prompt, 60, 61, 62])
    assert b is not None and b.reused_tokens == 3 * B


def test_reuse_leaves_two_prompt_tokens_to_compute() -> None:
    t = SlotTable(2, B)
    prompt = ids(9)
    served(t, prompt, 9)
    # 9 tokens = two blocks and one; reusing both blocks would leave one token, a one-token chunk
    again = t.acquire(prompt)
    assert again is not None and again.reused_tokens == B


def test_failed_slots_drop_their_cache() -> None:
    t = SlotTable(1, B)
    served(t, ids(9), 9, keep_cache=False)
    assert t.cached_blocks == 0
    again = t.acquire(ids(9))
    assert again is not None and again.reused_tokens == 0 and again.ops == (KvOp("clear", 0),)


def test_a_slot_keeps_only_blocks_it_computed() -> None:
    t = SlotTable(1, B)
    served(t, ids(12), 5)  # prefill stopped after five tokens (cancelled)
    assert t.cached_blocks == 1


def test_bad_sizes_are_refused() -> None:
    with pytest.raises(ValueError):
        SlotTable(0, B)
    with pytest.raises(ValueError):
        SlotTable(2, 0)
