"""backends/tiled.py's call layout: which prompt pieces get padding, which decode tokens get a twin, where."""

from __future__ import annotations

import pytest

from sluicegate.backends.base import BatchItem
from sluicegate.backends.tiled import SPLIT_KV_FROM, TILE_ROWS, pad, twins


def test_a_short_prompt_piece_is_padded_to_the_tiled_kernels_rows_after_its_tokens() -> None:
    item = BatchItem(3, [5, 6, 7], 40, want_logits=True, prompt=True)
    padded, n = pad(item, window=1024)
    assert n == TILE_ROWS - 3 and len(padded.token_ids) == TILE_ROWS
    assert list(padded.token_ids[:3]) == [5, 6, 7] and padded.start_pos == 40 and padded.slot == 3


def test_long_pieces_and_generated_tokens_are_left_alone() -> None:
    long = BatchItem(0, list(range(TILE_ROWS)), 0, prompt=True)
    assert pad(long, 1024) == (long, 0)
    verify = BatchItem(0, [1, 2, 3], 500, logits_all=True)
    assert pad(verify, 1024) == (verify, 0)


def test_a_generated_item_that_would_take_the_tiled_kernel_is_refused() -> None:
    with pytest.raises(ValueError, match="tiled kernel"):
        pad(BatchItem(0, list(range(TILE_ROWS)), 500, logits_all=True), 1024)


def test_padding_must_fit_the_slots_stream() -> None:
    assert pad(BatchItem(0, [1, 2], 1024 - TILE_ROWS, prompt=True), 1024)[1] == TILE_ROWS - 2
    with pytest.raises(ValueError, match="padded"):
        pad(BatchItem(0, [1, 2], 1024 - TILE_ROWS + 1, prompt=True), 1024)


def decode(slot: int, pos: int) -> BatchItem:
    return BatchItem(slot, [9], pos)


def test_a_lone_decode_token_past_the_split_kv_threshold_gets_a_twin_in_the_emptier_neighbour() -> None:
    ends = {2: 700, 4: 10}
    got = twins([decode(3, SPLIT_KV_FROM)], 8, lambda s: ends.get(s, 0))
    assert got is not None and [(t.slot, t.start_pos, t.want_logits) for t in got] == [(4, 10, False)]


def test_tokens_in_company_or_before_the_threshold_get_none() -> None:
    assert twins([decode(0, 900), decode(1, 900)], 8, lambda s: 0) == []  # one micro-batch: the one-row path
    assert twins([decode(5, SPLIT_KV_FROM - 1)], 8, lambda s: 0) == []


def test_one_twin_serves_the_two_tokens_beside_it() -> None:
    got = twins([decode(1, 600), decode(3, 600), decode(6, 600)], 8, lambda s: 0)
    assert got is not None and sorted(t.slot for t in got) in ([0, 2, 5], [0, 2, 7], [2, 5], [2, 7])
    slots = {1, 3, 6} | {t.slot for t in got}
    assert all(s - 1 in slots or s + 1 in slots for s in (1, 3, 6))  # none left alone in its micro-batch


def test_a_single_slot_has_no_neighbour_to_host_one() -> None:
    assert twins([decode(0, 600)], 1, lambda s: 0) is None
