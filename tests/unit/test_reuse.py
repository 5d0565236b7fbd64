"""What deadline admission expects the prefix cache to serve (engine/reuse.py)."""

from __future__ import annotations

import random

from sluicegate.engine.reuse import RecentPrompts, common_prefix


def test_the_common_prefix_matches_a_plain_loop() -> None:
    rng = random.Random(7)
    for _ in range(300):
        n = rng.randrange(0, 60)
        a = [rng.randrange(3) for _ in range(n)]
        b = a[: rng.randrange(0, n + 1)] + [rng.randrange(3) for _ in range(rng.randrange(0, 20))]
        slow = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))
        assert common_prefix(a, b) == slow, (a, b)
        at_least = rng.randrange(0, 10)  # a bound known from another prompt: only a longer match is exact
        got = common_prefix(a, b, at_least)
        assert got == slow if slow > at_least else got <= at_least, (a, b, at_least)


def test_a_prompt_expects_its_longest_prefix_among_those_not_waiting() -> None:
    recent = RecentPrompts(keep=3)
    template = list(range(100, 130))
    assert recent.expect([*template, 1, 2, 3], waiting=set()) == 0  # nothing computed yet
    recent.remember("a", [*template, 1, 2, 3], 0)
    assert recent.expect([*template, 9, 9], waiting={"a"}) == 0  # "a" is still waiting: not computed
    assert recent.expect([*template, 9, 9], waiting=set()) == 30
    assert recent.expect([*template, 1, 2, 3], waiting=set()) == 31  # the same prompt: all but the last two
    recent.remember("b", [*template, 9, 9], 30)
    assert recent.expected == {"b": 30}
    recent.forget("b")
    assert recent.expected == {}
    for k in "cde":  # the ring keeps the last 3
        recent.remember(k, [k == "c", 5, 5, 5], 0)
    assert recent.expect([*template, 7, 7], waiting=set()) == 0
