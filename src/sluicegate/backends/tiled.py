"""Tiled prefill: prompt tokens on ggml's tiled flash-attention kernel, generated tokens on its one-row path,
each token computed one way whatever its company, its chunking or the cache (docs/engine.md, "Tiled prefill").

With K and V both f16, ggml's CPU flash attention (ggml-cpu/ops.cpp, `ggml_compute_forward_flash_attn_ext_f16`)
picks a code path per micro-batch, by its shape:

- **tiled** when a sequence brings at least `TILE_ROWS` (64, `GGML_FA_TILE_Q`) query rows. A tile's rows are
  zero-padded to 64, its KV tiles start at absolute cell 0 in steps of 64, and a row's softmax and V sums see
  only its own scores (a fully masked KV tile adds exactly nothing), so a row's result depends on its query
  and the cache, not on which other rows share its call: any cut of a prompt into pieces of 64 or more rows
  gives the same bits (measured: pieces of 64, 100, 128, 200 and 512 against 512 + 512, and 1 or 2 threads);
- **split-KV** for one token of one sequence over >= 512 KV cells: partial softmaxes per thread, merged;
- **one row at a time** otherwise: each query row alone, cells in order.

The rule this module keeps: every prompt token is computed tiled, every generated token (decode steps and
speculative verification) one row at a time, never split-KV.

- A prompt piece shorter than `TILE_ROWS` is padded with junk tokens after it to 64 rows; the causal mask
  hides them from the real rows, and their KV is removed after the call (`pad`). The runner's streams hold
  `TILE_ROWS` positions more than the window so that a piece ending at the window's edge still fits.
- A decode token alone in its micro-batch (llama.cpp groups only consecutive sequence ids) past
  `SPLIT_KV_FROM` positions would take the split-KV path; a junk token in a neighbouring slot joins its
  micro-batch, which puts it on the one-row path (`twins`), and is removed after the call. With one thread
  split-KV is the one-row path (a single partial, merged by multiplying with exactly 1), the fallback when
  no neighbour can host one.

What it costs and gives (docs/benchmarks.md, "Tiled prefill"): long prompts prefill at llama.cpp's own tiled
speed (1.01x llama-server at 512 and 1,024 tokens, against 0.82-0.88x on the one-row path, 0.38-0.57x on a
slower CPU); a lone sequence's decode step past `SPLIT_KV_FROM` positions carries a second row; a reply's KV is
not what a prefill of it computes, so a conversation's next turn recomputes the previous reply
(`RunnerLimits.decoded_kv_exact` is False).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace

from sluicegate.backends.base import BatchItem

TILE_ROWS = 64  # ggml-cpu's GGML_FA_TILE_Q: query rows of one sequence from which a call takes the tiled kernel
SPLIT_KV_FROM = 192  # a lone decode token from this position may meet >= 512 KV cells (n_kv pads to 256): twin it


def pad(item: BatchItem, window: int) -> tuple[BatchItem, int]:
    """`item` with junk tokens after it up to `TILE_ROWS` rows, and how many: a prompt piece on the tiled kernel.
    `window`: the positions the slot's stream holds (the junk must fit)."""
    if not item.prompt:
        if len(item.token_ids) >= TILE_ROWS:
            raise ValueError(f"a generated-token item of {len(item.token_ids)} tokens would take the tiled kernel")
        return item, 0
    n = TILE_ROWS - len(item.token_ids)
    if n <= 0:
        return item, 0
    if item.start_pos + TILE_ROWS > window:
        raise ValueError(f"a prompt piece at position {item.start_pos} cannot be padded to {TILE_ROWS} rows")
    return replace(item, token_ids=[*item.token_ids, *[item.token_ids[-1]] * n]), n


def twins(singles: Sequence[BatchItem], n_slots: int, end_of: Callable[[int], int]) -> list[BatchItem] | None:
    """Junk tokens that keep every decode token of `singles` (one token each, in slot order) off the split-KV
    path: one in a neighbouring slot of each token that would be alone in its micro-batch past
    `SPLIT_KV_FROM`. `end_of(slot)`: the next position of a slot's stream. A host neighbour is not in
    `singles` (else the token was not alone); the one holding fewer positions is taken (its junk token reads
    them all). None: some token has no neighbour to host one (a single slot)."""
    slots = {item.slot for item in singles}
    hosts: dict[int, int] = {}
    for item in singles:
        s = item.slot
        if s - 1 in slots or s + 1 in slots or s - 1 in hosts or s + 1 in hosts or item.start_pos < SPLIT_KV_FROM:
            continue
        near = [h for h in (s - 1, s + 1) if 0 <= h < n_slots]
        if not near:
            return None
        h = min(near, key=end_of)
        hosts[h] = end_of(h)
    return [BatchItem(h, [singles[0].token_ids[0]], pos, want_logits=False) for h, pos in hosts.items()]
