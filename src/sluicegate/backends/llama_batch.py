"""The `llama_batch` the llama.cpp runner fills for each `llama_decode` call (backends/llama_cpp.py)."""

from __future__ import annotations

import ctypes
from collections.abc import Sequence

import llama_cpp as L
import numpy as np

from sluicegate.backends.base import BatchItem


def n_rows(item: BatchItem) -> int:
    """Logits rows `item` asks for: one per token (`logits_all`), its last token's, or none."""
    return len(item.token_ids) if item.logits_all else int(item.want_logits)


_IntP = ctypes.POINTER(ctypes.c_int)


class Batch:
    """A `llama_batch` over arrays numpy owns, filled with a few slice assignments per step instead of five
    ctypes writes per token (llama-cpp-python's `llama_batch_init` arrays are only reachable one element at
    a time). Each token belongs to one sequence: `seq_id[i]` points at `seq[i]` once and for all."""

    def __init__(self, n: int) -> None:
        self.token = np.zeros(n, dtype=np.int32)
        self.pos = np.zeros(n, dtype=np.int32)
        self.n_seq_id = np.ones(n, dtype=np.int32)
        self.seq = np.zeros(n, dtype=np.int32)
        self.logits = np.zeros(n, dtype=np.int8)
        base = self.seq.ctypes.data
        self._seq_ptrs = (_IntP * n)(*(ctypes.cast(base + 4 * i, _IntP) for i in range(n)))
        self.struct = L.llama_batch(
            n_tokens=0, token=self.token.ctypes.data_as(_IntP), embd=None, pos=self.pos.ctypes.data_as(_IntP),
            n_seq_id=self.n_seq_id.ctypes.data_as(_IntP), seq_id=ctypes.cast(self._seq_ptrs, ctypes.POINTER(_IntP)),
            logits=self.logits.ctypes.data_as(ctypes.POINTER(ctypes.c_int8)),
        )

    def fill(self, items: Sequence[BatchItem], pads: Sequence[int] = ()) -> int:
        """Lay `items` out one after the other; logits for each wanting item's last token (every token of a
        `logits_all` item), or its last but `pads[k]` (junk padding, backends/tiled.py). Returns tokens."""
        if not pads and all(len(item.token_ids) == 1 for item in items):  # decode: one vectorised write an array
            n = len(items)
            self.token[:n] = [item.token_ids[0] for item in items]
            self.pos[:n] = [item.start_pos for item in items]
            self.seq[:n] = [item.slot for item in items]
            self.logits[:n] = [item.want_logits or item.logits_all for item in items]
        else:
            n = 0
            for j, item in enumerate(items):
                k, junk = len(item.token_ids), pads[j] if pads else 0
                self.token[n : n + k] = item.token_ids
                self.pos[n : n + k] = np.arange(item.start_pos, item.start_pos + k, dtype=np.int32)
                self.seq[n : n + k] = item.slot
                self.logits[n : n + k] = item.logits_all
                self.logits[n + k - 1 - junk] = item.want_logits or item.logits_all
                n += k
        self.struct.n_tokens = n
        return n
