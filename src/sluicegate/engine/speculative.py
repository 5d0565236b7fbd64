"""Prompt-lookup (n-gram) drafting for opt-in speculative decoding (docs/engine.md).

No second model: a greedy sequence's next tokens are guessed by finding the most recent earlier occurrence of
its last n tokens in its own prompt and output, and proposing the tokens that followed it. The engine then
feeds the last token and the drafts as one item, reads the logits of every position, and keeps the longest
prefix of drafts that matches the greedy choice plus the one token the model chose after it. Knob names follow
vLLM's `ngram` method (`num_speculative_tokens`, `prompt_lookup_max`, `prompt_lookup_min`).

Hand-written because it is a few lines of numpy over a sequence the engine already holds.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from sluicegate.backends.base import ModelRunner

if TYPE_CHECKING:
    from sluicegate.engine.scheduler import Chunk


def propose(context: Sequence[int], k: int, n_max: int, n_min: int = 1) -> list[int]:
    """Up to `k` tokens that followed the most recent earlier occurrence of `context`'s last n tokens.

    n goes from `n_max` down to `n_min`; the first n with a match wins (a longer match predicts better).
    The occurrence must start before the tail itself and be followed by at least one token; the proposal may
    run into the tail (a repeating pattern continues). Empty when nothing matches or `k` < 1.
    """
    total = len(context)
    if k < 1 or total < 2:
        return []
    arr = np.asarray(context, dtype=np.int64)
    for n in range(min(n_max, total - 1), max(n_min, 1) - 1, -1):
        tail = arr[total - n :]
        windows = sliding_window_view(arr[: total - 1], n)  # starts 0 .. total-1-n: each has a follower
        hits = np.flatnonzero((windows == tail).all(axis=1))
        if len(hits):
            start = int(hits[-1]) + n
            return [int(t) for t in arr[start : start + k]]
    return []


def accepted(drafts: Sequence[int], chosen: Sequence[int]) -> int:
    """How many drafts the model agreed with: the longest prefix where `chosen[j] == drafts[j]`.

    `chosen[j]` is the token the model picked at the position the draft `drafts[j]` occupies (`chosen` has
    one more entry than `drafts`: the token after the last draft).
    """
    n = 0
    for d, c in zip(drafts, chosen, strict=False):
        if d != c:
            break
        n += 1
    return n


def settle(chunks: Sequence[Chunk], sampled: Sequence[int], runner: ModelRunner) -> tuple[int, int]:
    """After `Scheduler.update`: drop the KV of rejected drafts (a running sequence's positions past
    `num_computed`). Returns (drafted, accepted) tokens of the step. `sampled` has one token per logits row."""
    from sluicegate.engine.scheduler import SeqStatus  # the scheduler imports this module

    drafted = agreed = 0
    it = iter(sampled)
    for c in chunks:
        chosen = [next(it) for _ in range(1 + c.n_draft)] if c.want_logits else []
        if not c.n_draft:
            continue
        drafted += c.n_draft
        agreed += accepted(c.token_ids[1:], chosen)
        seq, held = c.seq, c.start_pos + len(c.token_ids)
        if seq.status is SeqStatus.RUNNING and seq.slot is not None and seq.num_computed < held:
            runner.truncate(seq.slot, seq.num_computed)
    return drafted, agreed
