"""A host-memory KV tier: slots' KV snapshots kept after the slot is reused, keyed by the tokens they hold.

When a free slot's cached tokens are about to be evicted (SlotTable.acquire), the engine saves the slot's KV
(`ModelRunner.save`) here first; a later prompt that starts with more of those tokens than any slot holds is
restored from here (`ModelRunner.restore`, then truncated to the shared prefix) instead of being prefilled
again. A snapshot restores a slot bit for bit, so outputs never depend on the tier (docs/engine.md, "KV tier").

Entries are LRU within a byte budget: a `put` that would exceed it drops the least recently used entries
first, and a snapshot larger than the whole budget is not kept. An entry whose tokens are a prefix of a
longer entry's is redundant (the longer one restores it and more) and is not kept either.

Hand-written (the radix tree, radix.py, indexes a fixed set of slots, not a changing set of entries): token
tuples in LRU order (an OrderedDict) and the same keys sorted (a list kept with `bisect`). In lexicographic
order the key sharing the longest prefix with a prompt is next to where the prompt would sort, so a lookup
is a binary search and two comparisons (tuple comparison runs in C), however many entries the budget holds.
"""

from __future__ import annotations

import bisect
import os
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass


def default_budget() -> int:
    """An eighth of the machine's physical memory (0 where it cannot be read): the model, the slots' own KV
    and the server stay well clear of it."""
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") // 8
    except (ValueError, OSError):
        return 0


@dataclass(frozen=True, slots=True)
class TierHit:
    shared: int  # leading tokens of the prompt the snapshot holds
    snapshot: bytes
    key: tuple[int, ...]


def _shared(a: tuple[int, ...], b: tuple[int, ...]) -> int:
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return n
    k = 0
    while a[k] == b[k]:
        k += 1
    return k


class KvTier:
    """Snapshots by token prefix, LRU within `budget_bytes`. Used by the engine thread only."""

    def __init__(self, budget_bytes: int) -> None:
        if budget_bytes < 0:
            raise ValueError("the KV tier's byte budget cannot be negative")
        self.budget_bytes = budget_bytes
        self._entries: OrderedDict[tuple[int, ...], bytes] = OrderedDict()  # least recently used first
        self._sorted: list[tuple[int, ...]] = []  # the same keys in lexicographic order
        self.bytes_held = 0
        self.saves = 0  # snapshots kept
        self.dropped = 0  # snapshots dropped to stay within the budget (or too large for it)

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def enabled(self) -> bool:
        return self.budget_bytes > 0

    def covers(self, tokens: Sequence[int]) -> bool:
        """Whether an entry already holds `tokens` (as all or a prefix of its own): saving them adds nothing.
        Keys starting with `tokens` sort from where `tokens` would."""
        t = tuple(tokens)
        i = bisect.bisect_left(self._sorted, t)
        return i < len(self._sorted) and self._sorted[i][: len(t)] == t

    def lookup(self, prompt: Sequence[int]) -> TierHit | None:
        """The entry sharing the longest prefix with `prompt`, or None (`touch` it when it is used)."""
        p = tuple(prompt)
        i = bisect.bisect_left(self._sorted, p)
        best: tuple[int, tuple[int, ...]] | None = None
        for key in self._sorted[max(i - 1, 0) : i + 1]:
            k = _shared(key, p)
            if k and (best is None or k > best[0]):
                best = (k, key)
        if best is None:
            return None
        return TierHit(best[0], self._entries[best[1]], best[1])

    def touch(self, key: tuple[int, ...]) -> None:
        """The entry was just used: it is the last to be dropped."""
        if key in self._entries:
            self._entries.move_to_end(key)

    def put(self, tokens: Sequence[int], snapshot: bytes) -> bool:
        """Keep the snapshot of `tokens` (dropping entries it makes redundant, then LRU ones over the budget);
        False if it is larger than the whole budget or already covered."""
        key = tuple(tokens)
        if not key or len(snapshot) > self.budget_bytes:
            self.dropped += bool(key) and self.enabled
            return False
        if self.covers(key):
            return False
        while (i := bisect.bisect_left(self._sorted, key)) and key[: len(self._sorted[i - 1])] == self._sorted[i - 1]:
            self._drop(self._sorted[i - 1])  # a prefix of the new key sorts right before it
        while self.bytes_held + len(snapshot) > self.budget_bytes:
            self._drop(next(iter(self._entries)))
            self.dropped += 1
        self._entries[key] = snapshot
        bisect.insort(self._sorted, key)
        self.bytes_held += len(snapshot)
        self.saves += 1
        return True

    def _drop(self, key: tuple[int, ...]) -> None:
        self.bytes_held -= len(self._entries.pop(key))
        del self._sorted[bisect.bisect_left(self._sorted, key)]
