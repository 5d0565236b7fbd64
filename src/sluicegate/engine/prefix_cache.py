"""Slot table and prefix cache: which slot holds which prompt tokens, and what a new prompt can reuse.

A slot is one sequence's KV stream (see backends/base.py). A radix tree (radix.py) indexes the tokens
each slot's KV holds, published as they are computed (the scheduler records them: prompt tokens, and
generated ones where the runner's decoded KV is exact, see Scheduler._record). A new prompt reuses the
longest prefix any slot holds, at token granularity (`granularity` > 1 rounds the reuse down to a multiple
of it). This is sound because the runner computes a prompt token's KV bit-identically however the prompt
was chunked, as long as no chunk is a single token (docs/engine.md, tests/e2e/test_prefix_reuse.py), and
publishes a decoded token only where its KV equals a prefill's: reuse never changes an output.

A request takes a free slot (`acquire`): one holding its longest cached prefix is reused in place (its tail
truncated), or else the prefix is copied from whichever slot holds it (busy or free) into another free slot and
truncated there. Which free slot takes the request is first a question of speed: one that joins two runs of busy
slots, else one that extends a run, the nearest to the busy ones first. llama.cpp computes each run of adjacent
busy slots as its own micro-batch, a pass over the weights each (docs/engine.md): 7 sequences in slots 0-6 took
37 ms a step here, spread over slots 0-15 84 ms (bench/step_layout.py); so a burst after a busy spell, given the
least recently used slots across the table, decoded at 2x the cost of its batch. Among those it is an eviction
choice: first one whose cached tokens all survive (an empty slot, a slot whose path other slots also hold, or
one the new prompt repeats: those tokens are recomputed anyway), in place before a copy, lowest id first; else
the least recently used slot (released, or lending its prefix to a request: LRU over the tree's leaves). A busy
slot's tokens are never evicted. Reuse always leaves at least the last two prompt tokens to compute: the last
one's logits give the first generated token, and a one-token chunk would round differently from the same token
computed in a longer one.

With a host-memory KV tier (kv_tier.py), evicted tokens are saved before they go: the slot that takes the
request gets a "save" op of its whole cached path first, when tokens no slot would hold any more are about to be
dropped and the tier does not hold them yet. A prompt the tier shares more tokens with than any slot is
"restore"d from the tier's snapshot into the slot taking it, then truncated to the shared prefix (rounded and
capped exactly as a slot's prefix is), so a restored prefix is used exactly as a copied one would be.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from sluicegate.engine.kv_tier import KvTier
from sluicegate.engine.radix import RadixTree


@dataclass(frozen=True, slots=True)
class KvOp:
    """A change to the runner's KV the engine applies before the step's forward pass."""

    kind: Literal["clear", "truncate", "copy", "save", "restore"]
    slot: int
    arg: int = 0  # truncate: positions kept; copy: source slot; save: positions saved
    tokens: tuple[int, ...] = ()  # save: the tokens those positions hold (the tier's key)
    snapshot: bytes = b""  # restore: what the slot is to hold (then truncated)


@dataclass(frozen=True, slots=True)
class Acquired:
    slot: int
    reused_tokens: int
    ops: tuple[KvOp, ...]


class SlotTable:
    def __init__(self, n_slots: int, granularity: int = 1, tier: KvTier | None = None) -> None:
        if n_slots < 1 or granularity < 1:
            raise ValueError("need at least one slot and a positive reuse granularity")
        self.granularity = granularity
        self.tier = tier if tier is not None and tier.enabled else None
        self.tree = RadixTree(n_slots)
        self._busy = [False] * n_slots
        self._last_used = [0] * n_slots  # tick of the last release or reuse (LRU)
        self._tick = 0
        self.lookups = 0  # acquisitions
        self.hits = 0  # acquisitions that reused at least one token
        self.reused_tokens = 0  # prompt tokens not recomputed thanks to the cache
        self.evictions = 0  # cached tokens dropped (held by no slot any more) to make room
        self.tier_hits = 0  # acquisitions whose prefix was restored from the tier
        self.restored_tokens = 0  # of `reused_tokens`, those restored from the tier

    @property
    def n_slots(self) -> int:
        return len(self._busy)

    @property
    def n_busy(self) -> int:
        return sum(self._busy)

    @property
    def n_free(self) -> int:
        return self.n_slots - self.n_busy

    @property
    def cached_tokens(self) -> int:
        """Prompt tokens held by free slots, available for reuse (a prefix two slots hold counts twice)."""
        return sum(self.tree.length(i) for i, busy in enumerate(self._busy) if not busy)

    def is_busy(self, slot: int) -> bool:
        return self._busy[slot]

    def n_cached(self, slot: int) -> int:
        """Prompt tokens the slot's KV is known to hold."""
        return self.tree.length(slot)

    def acquire(self, prompt_ids: Sequence[int]) -> Acquired | None:
        """Take a slot for a new prompt, reusing the longest cached prefix of it; None if all are busy."""
        free = [i for i, busy in enumerate(self._busy) if not busy]
        if not free:
            return None
        self.lookups += 1
        shared = self.tree.common_prefixes(prompt_ids)
        n = self._usable(max(shared.values(), default=0), len(prompt_ids))
        hit = self.tier.lookup(prompt_ids) if self.tier is not None and prompt_ids else None
        restore = hit is not None and self._usable(hit.shared, len(prompt_ids)) > n
        if restore:
            assert hit is not None
            n = self._usable(hit.shared, len(prompt_ids))
        holders = [s for s, k in sorted(shared.items()) if k >= n] if n and not restore else []

        def lost(d: int) -> int:  # cached tokens no slot would hold once `d` serves this prompt
            return max(0, self.tree.length(d) - max(self.tree.unique_from(d), shared.get(d, 0)))

        busy, held = self._busy, [i for i, b in enumerate(self._busy) if b]

        def runs(d: int) -> int:  # how the runs of adjacent busy slots change: +1 a new one, 0 one grows, -1 two join
            return 1 - (d > 0 and busy[d - 1]) - (d + 1 < len(busy) and busy[d + 1])

        def widens(d: int) -> int:  # how far the busy slots' span grows
            return 0 if not held or held[0] <= d <= held[-1] else max(held[0] - d, d - held[-1])

        def order(d: int) -> tuple[int, int, bool, int, bool, int]:
            loses = lost(d) > 0
            return (runs(d), widens(d), loses, self._last_used[d] if loses else 0, d not in holders, d)

        dst = min(free, key=order)
        ops: tuple[KvOp, ...] = ()
        kept = n if dst in holders else 0
        evicted = max(0, self.tree.length(dst) - max(self.tree.unique_from(dst), kept))
        self.evictions += evicted
        if evicted and self.tier is not None:  # saved before anything changes the slot
            path = tuple(self.tree.tokens(dst))
            if not self.tier.covers(path):
                ops = (KvOp("save", dst, len(path), tokens=path),)
        if restore:
            assert hit is not None and self.tier is not None
            self.tier.touch(hit.key)
            ops = (*ops, KvOp("restore", dst, snapshot=hit.snapshot), KvOp("truncate", dst, n))
            self.tree.truncate(dst, 0)
            self.tree.extend(dst, prompt_ids, n)
            self.tier_hits += 1
            self.restored_tokens += n
        elif kept:
            ops = (*ops, KvOp("truncate", dst, n))
            self.tree.truncate(dst, n)
        elif n:
            ops = (*ops, KvOp("copy", dst, holders[0]), KvOp("truncate", dst, n))
            self.tree.truncate(dst, 0)
            self.tree.extend(dst, prompt_ids, n)
        else:
            ops = (*ops, KvOp("clear", dst))
            self.tree.truncate(dst, 0)
        self._busy[dst] = True
        if n:
            self.hits += 1
            self.reused_tokens += n
            for s in holders:  # a prefix just reused is recently used, wherever it lives
                self._touch(s)
        return Acquired(dst, n, ops)

    def _usable(self, shared: int, n_prompt: int) -> int:
        """Of `shared` cached tokens, those a prompt of `n_prompt` reuses: at least its last two are computed, and
        the reuse is a multiple of `granularity`."""
        n = min(shared, max(n_prompt - 2, 0))
        return n - n % self.granularity

    def _touch(self, slot: int) -> None:
        self._tick += 1
        self._last_used[slot] = self._tick

    def record(self, slot: int, token_ids: Sequence[int], n_computed: int) -> None:
        """The slot's KV holds `token_ids[:n_computed]`, all computed as prompt: make them reusable."""
        if n_computed > self.tree.length(slot):
            self.tree.extend(slot, token_ids, n_computed)

    def release(self, slot: int, *, keep_cache: bool = True) -> None:
        self._touch(slot)
        self._busy[slot] = False
        if not keep_cache:
            self.tree.truncate(slot, 0)
