"""The radix tree over slots' prompt tokens: insertion, token-granular matching, splits, merges, holder counts."""

from __future__ import annotations

import random

from sluicegate.engine.radix import RadixTree


def test_matches_any_common_prefix_length() -> None:
    base = list(range(100, 170))
    for k in range(1, len(base) + 1):  # a prompt sharing exactly k leading tokens, at every k
        t = RadixTree(2)
        t.extend(0, base, len(base))
        probe = [*base[:k], 9999, 1, 2]
        assert t.common_prefixes(probe) == {0: k}
        assert t.common_prefixes(base[:k]) == {0: k}  # a prompt shorter than the cached path
        t.check()
    t = RadixTree(1)
    t.extend(0, base, len(base))
    assert t.common_prefixes([7, *base]) == {}


def test_diverging_paths_split_an_edge_and_share_its_holders() -> None:
    t = RadixTree(3)
    a = [1, 2, 3, 4, 5, 6]
    b = [1, 2, 3, 9, 9]
    t.extend(0, a, len(a))
    assert t.n_nodes == 1
    t.extend(1, b, len(b))
    assert t.n_nodes == 3  # [1 2 3] shared by both, [4 5 6] and [9 9] below it
    assert t.common_prefixes([1, 2, 3, 4, 0]) == {0: 4, 1: 3}
    assert t.unique_from(0) == 3 and t.unique_from(1) == 3
    assert t.tokens(0) == a and t.tokens(1) == b
    t.extend(2, a, 2)  # a path ending inside the shared edge splits it again
    assert t.n_nodes == 4 and t.length(2) == 2 and t.tokens(2) == [1, 2]
    assert t.unique_from(2) == 2  # slot 2 holds nothing the others do not
    t.check()


def test_extend_grows_a_path_in_steps_like_chunked_prefill() -> None:
    t = RadixTree(2)
    ids = list(range(50))
    for upto in (2, 3, 19, 20, 48):
        t.extend(0, ids, upto)
        assert t.length(0) == upto and t.tokens(0) == ids[:upto]
        t.check()
    assert t.n_nodes == 1  # a path only its slot holds stays one edge
    t.extend(1, ids, 10)
    t.extend(1, ids, 30)  # follows slot 0's edge, splitting it where slot 1 stops
    assert t.common_prefixes(ids) == {0: 48, 1: 30}
    assert t.n_nodes == 2
    t.check()


def test_truncate_drops_unheld_edges_and_merges_the_rest() -> None:
    t = RadixTree(2)
    a, b = [1, 2, 3, 4, 5], [1, 2, 3, 7, 8]
    t.extend(0, a, 5)
    t.extend(1, b, 5)
    assert t.n_nodes == 3
    t.truncate(1, 0)  # slot 1 forgets everything: its edge goes, the shared edge merges back
    assert t.n_nodes == 1 and t.tokens(0) == a and t.length(1) == 0
    assert t.common_prefixes(b) == {0: 3}
    t.truncate(0, 2)
    assert t.tokens(0) == [1, 2] and t.n_nodes == 1
    t.check()


def test_holder_counts_follow_every_slot_through_shared_edges() -> None:
    t = RadixTree(4)
    system = list(range(30))
    for slot in range(4):
        t.extend(slot, [*system, 1000 + slot, 2000], 32)
    assert t.common_prefixes([*system, 5]) == {0: 30, 1: 30, 2: 30, 3: 30}
    assert all(t.unique_from(s) == 30 for s in range(4))
    for slot in range(3):
        t.truncate(slot, 0)
    # the system prompt is now slot 3's alone: one edge again
    assert t.unique_from(3) == 0 and t.n_nodes == 1
    t.check()


def _lcp(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def test_random_operations_agree_with_per_slot_lists() -> None:
    rng = random.Random(11)
    n_slots = 5
    t = RadixTree(n_slots)
    paths: list[list[int]] = [[] for _ in range(n_slots)]
    stems = [[rng.randrange(4) for _ in range(rng.randrange(1, 40))] for _ in range(6)]
    for _ in range(3000):
        slot = rng.randrange(n_slots)
        op = rng.random()
        if op < 0.5:  # continue the slot's own path (a prefill chunk)
            ids = paths[slot] + [rng.randrange(4) for _ in range(rng.randrange(1, 12))]
            upto = rng.randrange(len(paths[slot]) + 1, len(ids) + 1)
            t.extend(slot, ids, upto)
            paths[slot] = ids[:upto]
        elif op < 0.8:  # a new request: truncate to what it shares, then follow a stem
            prompt = rng.choice(stems) + [rng.randrange(4) for _ in range(rng.randrange(0, 10))]
            keep = min(_lcp(paths[slot], prompt), rng.randrange(len(prompt) + 1))
            t.truncate(slot, keep)
            t.extend(slot, prompt, len(prompt))
            paths[slot] = prompt
        else:
            keep = rng.randrange(len(paths[slot]) + 1)
            t.truncate(slot, keep)
            paths[slot] = paths[slot][:keep]
        t.check()
        probe = rng.choice(stems) + [rng.randrange(4) for _ in range(5)]
        expect = {s: _lcp(p, probe) for s, p in enumerate(paths) if _lcp(p, probe) > 0}
        assert t.common_prefixes(probe) == expect
        for s, p in enumerate(paths):
            assert t.tokens(s) == p and t.length(s) == len(p)
            others = [_lcp(p, q) for o, q in enumerate(paths) if o != s]
            assert t.unique_from(s) == min(len(p), max([0, *others]))
