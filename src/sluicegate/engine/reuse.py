"""What deadline admission expects the prefix cache to serve of a new prompt (engine/forecast.py).

The slot table (prefix_cache.py) belongs to the engine thread, which changes it outside the engine's lock, so
admission (on the submitting thread, under the lock) cannot ask it. It asks this instead: the prompts of the
last requests admitted (as many as twice the slots: what the slots' KV most likely still holds), and expects a
new prompt to reuse the longest prefix it shares with one of them that is no longer waiting (a prompt still
waiting is not computed yet: a burst's prompts prefilled in the same step do not share). The expectation is
kept per request while it waits, so the queue it joins is forecast at the same tokens (`expected`).

Without it every prompt was forecast as computed whole, and each prefill charged to every request running beside
it, template and shared system prompt included: the forecast was pessimistic by 1.75x on a burst sharing a
100-token prefix, and a server at twice its capacity refused requests that would have fitted.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Container, Sequence


def common_prefix(a: Sequence[int], b: Sequence[int], at_least: int = 0) -> int:
    """The length of the longest common prefix of `a` and `b`, if longer than `at_least` (else `at_least` or less).
    A binary search on slices: each comparison runs in C, a Python loop over 4,000 tokens would not."""
    hi = min(len(a), len(b))
    if hi <= at_least or a[: at_least + 1] != b[: at_least + 1]:
        return min(at_least, hi)
    lo = at_least + 1  # a[:lo] == b[:lo]
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a[lo:mid] == b[lo:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo


class RecentPrompts:
    """Written and read under the engine's lock, except `expected`, read by the engine thread (one dict lookup)."""

    def __init__(self, keep: int) -> None:
        self._ring: deque[tuple[str, Sequence[int]]] = deque(maxlen=max(1, keep))
        self.expected: dict[str, int] = {}  # request id -> prompt tokens expected from the cache, while it waits

    def expect(self, ids: Sequence[int], waiting: Container[str]) -> int:
        """Prompt tokens of `ids` the prefix cache is expected to serve: never the last two (the engine always
        computes them, prefix_cache.py)."""
        best = 0
        for key, other in self._ring:
            if key not in waiting:
                best = max(best, common_prefix(ids, other, best))
        return min(best, max(len(ids) - 2, 0))

    def remember(self, request_id: str, ids: Sequence[int], cached: int) -> None:
        self._ring.append((request_id, ids))
        if cached:
            self.expected[request_id] = cached

    def forget(self, request_id: str) -> None:
        self.expected.pop(request_id, None)
