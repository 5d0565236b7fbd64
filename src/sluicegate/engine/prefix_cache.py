"""Slot table and prefix cache: which slot holds which prompt blocks, and what a new prompt can reuse.

Prompts are cut into fixed blocks of `block_size` token ids at absolute positions 0, B, 2B, ...; each full
block is addressed by a hash chain (a block's key covers every token before it). A slot remembers the keys of
the prompt blocks it has *prefilled*; decoded tokens are never reusable, because a token computed by a
one-token decode step is not bit-identical to the same token computed inside a prefill block, and reuse must
never change a request's output (see docs/engine.md).

A free slot keeps its KV as cache until it is needed; eviction takes the least recently used free slot,
empty ones first. Reuse is whole blocks only, and always leaves at least the last prompt token to compute,
since its logits give the first generated token.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

BlockKey = int


def block_keys(token_ids: Sequence[int], block_size: int) -> list[BlockKey]:
    """Hash-chain keys of every full block of `token_ids`."""
    keys: list[BlockKey] = []
    prev: BlockKey = 0
    for start in range(0, len(token_ids) - block_size + 1, block_size):
        prev = hash((prev, tuple(token_ids[start : start + block_size])))
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
    keys: list[BlockKey] = field(default_factory=list)
    last_used: int = 0


@dataclass(frozen=True, slots=True)
class Acquired:
    slot: int
    reused_tokens: int
    ops: tuple[KvOp, ...]


class SlotTable:
    def __init__(self, n_slots: int, block_size: int) -> None:
        self.block_size = block_size
        self._slots = [_Slot() for _ in range(n_slots)]
        self._tick = 0
        self.hits = 0  # acquisitions that reused at least one block
        self.reused_tokens = 0

    @property
    def n_busy(self) -> int:
        return sum(s.busy for s in self._slots)

    @property
    def n_free(self) -> int:
        return len(self._slots) - self.n_busy

    @property
    def cached_blocks(self) -> int:
        return sum(len(s.keys) for s in self._slots if not s.busy)

    def acquire(self, prompt_ids: Sequence[int]) -> Acquired | None:
        """Take a slot for a new prompt, reusing the longest cached whole-block prefix. None if none is free."""
        free = [i for i, s in enumerate(self._slots) if not s.busy]
        if not free:
            return None
        wanted = block_keys(prompt_ids[: max(len(prompt_ids) - 1, 0)], self.block_size)
        best_slot, best_n = -1, 0
        for i, s in enumerate(self._slots):
            n = _common_prefix(s.keys, wanted)
            if n > best_n or (n == best_n and n > 0 and not s.busy and self._slots[best_slot].busy):
                best_slot, best_n = i, n
        reuse = best_n * self.block_size
        ops: tuple[KvOp, ...]
        if best_n and not self._slots[best_slot].busy:
            dst = best_slot
            ops = (KvOp("truncate", dst, reuse),)
        else:
            dst = min(free, key=lambda i: (len(self._slots[i].keys) > 0, self._slots[i].last_used))
            ops = (KvOp("copy", dst, best_slot), KvOp("truncate", dst, reuse)) if best_n else (KvOp("clear", dst),)
        slot = self._slots[dst]
        slot.busy = True
        slot.keys = wanted[:best_n]
        if best_n:
            self.hits += 1
            self.reused_tokens += reuse
        return Acquired(dst, reuse, ops)

    def record_prefill(self, slot: int, prompt_ids: Sequence[int], n_prefilled: int) -> None:
        """Make the slot's prefilled whole prompt blocks reusable."""
        n_blocks = n_prefilled // self.block_size
        s = self._slots[slot]
        if n_blocks > len(s.keys):
            s.keys = block_keys(prompt_ids[: n_blocks * self.block_size], self.block_size)

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
