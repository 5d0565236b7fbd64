"""Slot table and prefix cache: which slot holds which token blocks, and what a new prompt can reuse.

A slot is one sequence's KV stream (see backends/base.py). Prompt token ids are cut into fixed blocks of
`block_size` at absolute positions 0, B, 2B, ...; each full block is addressed by a hash chain (a block's
key covers every token before it, so equal keys mean equal prefixes). A slot remembers the keys of the
prompt blocks its KV holds, as they are prefilled (the scheduler publishes them; generated tokens are
never published, see Scheduler._record_blocks). This is sound because the runner computes a prompt token's
KV bit-identically however the prompt was chunked (docs/engine.md): reuse never changes an output.

A request takes a slot: the free slot holding its longest cached prefix (reused in place, tail truncated),
or else a free slot into which the best busy slot's stream is copied and truncated, or else an empty slot,
or else the least recently used free slot (its cache is evicted). Reuse is whole blocks only and always
leaves at least the last two prompt tokens to compute: the last one's logits give the first generated
token, and a one-token chunk would round differently from the same token computed in a longer one.

Keys are BLAKE2b digests, not Python's `hash`: a crafted collision would hand one tenant another
tenant's KV.
"""

from __future__ import annotations

import hashlib
from array import array
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

BlockKey = bytes


def _chain(prev: BlockKey, block: Sequence[int]) -> BlockKey:
    return hashlib.blake2b(prev + array("q", block).tobytes(), digest_size=16).digest()


def block_keys(
    token_ids: Sequence[int], block_size: int, *, prev: BlockKey = b"", start: int = 0
) -> list[BlockKey]:
    """Hash-chain keys of the full blocks of `token_ids`, from block `start` on (`prev`: the key before)."""
    keys: list[BlockKey] = []
    for begin in range(start * block_size, len(token_ids) - block_size + 1, block_size):
        prev = _chain(prev, token_ids[begin : begin + block_size])
        keys.append(prev)
    return keys


@dataclass(frozen=True, slots=True)
class KvOp:
    """A change to the runner's KV the engine applies before the step's forward pass."""

    kind: Literal["clear", "truncate", "copy"]
    slot: int
    arg: int = 0  # truncate: positions kept; copy: source slot


@dataclass(slots=True)
class _Slot:
    busy: bool = False
    keys: list[BlockKey] = field(default_factory=list)  # blocks 0..len-1 of the slot's KV, all computed
    last_used: int = 0  # tick of the last release (LRU)


@dataclass(frozen=True, slots=True)
class Acquired:
    slot: int
    reused_tokens: int
    ops: tuple[KvOp, ...]


class SlotTable:
    def __init__(self, n_slots: int, block_size: int) -> None:
        if n_slots < 1 or block_size < 1:
            raise ValueError("need at least one slot and a positive block size")
        self.block_size = block_size
        self._slots = [_Slot() for _ in range(n_slots)]
        self._tick = 0
        self.lookups = 0  # acquisitions
        self.hits = 0  # acquisitions that reused at least one block
        self.reused_tokens = 0  # prompt tokens not recomputed thanks to the cache
        self.evictions = 0  # cached blocks dropped to make room

    @property
    def n_slots(self) -> int:
        return len(self._slots)

    @property
    def n_busy(self) -> int:
        return sum(s.busy for s in self._slots)

    @property
    def n_free(self) -> int:
        return len(self._slots) - self.n_busy

    @property
    def cached_blocks(self) -> int:
        """Blocks held by free slots, available for reuse."""
        return sum(len(s.keys) for s in self._slots if not s.busy)

    def is_busy(self, slot: int) -> bool:
        return self._slots[slot].busy

    def keys(self, slot: int) -> tuple[BlockKey, ...]:
        return tuple(self._slots[slot].keys)

    def n_blocks(self, slot: int) -> int:
        """Blocks the slot's KV is known to hold."""
        return len(self._slots[slot].keys)

    def acquire(self, prompt_ids: Sequence[int]) -> Acquired | None:
        """Take a slot for a new prompt, reusing its longest cached whole-block prefix; None if all busy."""
        free = [i for i, s in enumerate(self._slots) if not s.busy]
        if not free:
            return None
        self.lookups += 1
        wanted = block_keys(prompt_ids[: max(len(prompt_ids) - 2, 0)], self.block_size)
        best_slot, best_n = -1, 0
        for i, s in enumerate(self._slots):
            n = _common_prefix(s.keys, wanted)
            # a free slot wins a tie: it is reused in place, no copy
            if n > best_n or (n == best_n and n > 0 and not s.busy and self._slots[best_slot].busy):
                best_slot, best_n = i, n
        ops: tuple[KvOp, ...]
        if best_n and not self._slots[best_slot].busy:
            dst = best_slot
            if len(self._slots[dst].keys) > best_n:
                self.evictions += len(self._slots[dst].keys) - best_n
            ops = (KvOp("truncate", dst, best_n * self.block_size),)
        else:
            # empty slots first (lowest id keeps the busy slots packed), then the least recently used
            dst = min(free, key=lambda i: (len(self._slots[i].keys) > 0, self._slots[i].last_used, i))
            self.evictions += len(self._slots[dst].keys)
            if best_n:
                ops = (KvOp("copy", dst, best_slot), KvOp("truncate", dst, best_n * self.block_size))
            else:
                ops = (KvOp("clear", dst),)
        slot = self._slots[dst]
        slot.busy = True
        slot.keys = wanted[:best_n]
        if best_n:
            self.hits += 1
            self.reused_tokens += best_n * self.block_size
        return Acquired(dst, best_n * self.block_size, ops)

    def record(self, slot: int, token_ids: Sequence[int], n_computed: int) -> None:
        """The slot's KV holds `token_ids[:n_computed]`, all prefilled: make its new whole blocks reusable."""
        s = self._slots[slot]
        if (len(s.keys) + 1) * self.block_size > n_computed:
            return
        have = len(s.keys)
        upto = (n_computed // self.block_size) * self.block_size
        s.keys.extend(
            block_keys(token_ids[:upto], self.block_size, prev=s.keys[-1] if s.keys else b"", start=have)
        )

    def release(self, slot: int, *, keep_cache: bool = True) -> None:
        s = self._slots[slot]
        self._tick += 1
        s.busy, s.last_used = False, self._tick
        if not keep_cache:
            s.keys = []


def _common_prefix(a: Sequence[BlockKey], b: Sequence[BlockKey]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n
