"""A host-memory KV tier: slots' KV snapshots kept after the slot is reused, keyed by the tokens they hold.

When a free slot's cached tokens are about to be evicted (SlotTable.acquire), the engine saves the slot's KV
(`ModelRunner.save`) here first; a later prompt that starts with more of those tokens than any slot holds is
restored from here (`ModelRunner.restore`, then truncated to the shared prefix) instead of being prefilled
again. A snapshot restores a slot bit for bit, so outputs never depend on the tier (docs/engine.md, "KV tier").

Entries are LRU within a byte budget: a `put` that would exceed it drops the least recently used entries
first, and a snapshot larger than the whole budget is not kept. An entry whose tokens are a prefix of a
longer entry's is redundant (the longer one restores it and more) and is not kept either.

Hand-written: a dict of token tuples in LRU order (OrderedDict) with a linear longest-prefix scan. The budget
bounds the entries to a few hundred conversations (a token's KV is ~23 KB for the default model), and a scan
compares lists in C, which is cheap beside one prompt token's prefill (~10 ms here). The radix tree
(radix.py) indexes a fixed set of slots and would need reshaping for a changing set of entries.
"""

from __future__ import annotations

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


def _shared(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    if list(a[:n]) == list(b[:n]):
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
        self.bytes_held = 0
        self.saves = 0  # snapshots kept
        self.dropped = 0  # snapshots dropped to stay within the budget (or too large for it)

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def enabled(self) -> bool:
        return self.budget_bytes > 0

    def covers(self, tokens: Sequence[int]) -> bool:
        """Whether an entry already holds `tokens` (as all or a prefix of its own): saving them adds nothing."""
        n = len(tokens)
        return any(len(key) >= n and _shared(key, tokens) == n for key in self._entries)

    def lookup(self, prompt: Sequence[int]) -> TierHit | None:
        """The entry sharing the longest prefix with `prompt`, or None (`touch` it when it is used)."""
        best: tuple[int, tuple[int, ...]] | None = None
        first = prompt[0] if prompt else None
        for key in self._entries:
            if key[0] != first:
                continue
            k = _shared(key, prompt)
            if best is None or k > best[0]:
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
        for old in [k for k in self._entries if len(k) < len(key) and _shared(k, key) == len(k)]:
            self._drop(old)
        while self.bytes_held + len(snapshot) > self.budget_bytes:
            self._drop(next(iter(self._entries)))
            self.dropped += 1
        self._entries[key] = snapshot
        self.bytes_held += len(snapshot)
        self.saves += 1
        return True

    def _drop(self, key: tuple[int, ...]) -> None:
        self.bytes_held -= len(self._entries.pop(key))
