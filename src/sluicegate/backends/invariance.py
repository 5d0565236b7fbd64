"""The exactness guarantee, earned per model: measured at load, not assumed (docs/engine.md, "Earned per model").

Whether a token's logits depend on its company, its chunking or how its KV was made is a property of the
kernels its weight types take, not of the engine: llama.cpp's CPU backend sends a matrix product of some types
(Q4_0, Q5_0, Q8_0, IQ4_NL, F16, BF16, F32) to llamafile's tiled kernel when the step has two rows or more and to
ggml's dot product for one row, and the two round differently; other types (Q4_1, the K-quants) always take the
dot product. `make install` builds llama.cpp with the tiled kernel for one row too (scripts/llama-cpp-patch.py), so
every row of every type is computed one way; a stock build, or another backend, may not be. So at load the runner
is probed with the same tokens laid out the ways the engine lays them out, compared bit for bit:

- **batching**: a prompt's last logits computed alone and in a step beside other prompts, and a decode token
  alone and beside seven others;
- **chunking**: the prompt prefilled whole and in pieces of 2, 3, 4 and the rest (the scheduler makes no
  one-token prompt piece);
- **decoded**: the prompt fed one token a step (as a reply is decoded) against prefilled whole: the last row,
  and each of the last four rows against one call that returns every row (speculative verification).

What fails is withdrawn from the runner's declared limits (`RunnerLimits.batch_invariant`, `decoded_kv_exact`,
`drafts_exact`): the engine then stops reusing what is not exact, `/v1/models/{id}` (`kv.exact`) and the log say
which, and `system_fingerprint` says `batch-variant`. A probe costs a few dozen small forward passes
(~0.1-0.5 s), before readiness.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from sluicegate.backends.base import BatchItem, ModelRunner, RunnerLimits

PROBE_TEXT = "The quick brown fox jumps over the lazy dog, and then it runs all the way home to sleep."
MAX_PROBE_TOKENS = 12  # at least 10 (the pieces), and over 8: the K-quants change kernels at 8 rows
COMPANY = 8  # rows beside the probed one in a step (the 8-row step: where the tiled kernels start)


@dataclass(frozen=True, slots=True)
class Invariance:
    batching: bool
    chunking: bool
    decoded: bool
    drafts: bool
    why: str  # the first check that failed and by how much; "" when every one held

    def declare(self, limits: RunnerLimits) -> RunnerLimits:
        """`limits` with what did not hold withdrawn (a declared False stays False)."""
        return dataclasses.replace(
            limits, batch_invariant=limits.batch_invariant and self.batching and self.chunking,
            decoded_kv_exact=limits.decoded_kv_exact and self.decoded, drafts_exact=limits.drafts_exact and self.drafts)


def probe_tokens(runner: ModelRunner) -> list[int]:
    ids = runner.tokenize(PROBE_TEXT, add_special=True)
    return ids[:MAX_PROBE_TOKENS]


def probe(runner: ModelRunner, tokens: Sequence[int] | None = None) -> Invariance:
    """Runs the checks (module docstring) on the runner's first slots and clears them after."""
    toks = list(tokens) if tokens is not None else probe_tokens(runner)
    slots = min(runner.limits.n_slots, COMPANY)
    if len(toks) < 10:
        raise ValueError("the probe needs at least 10 tokens")
    try:
        return _probe(runner, toks, slots)
    finally:
        for s in range(slots):
            runner.clear(s)


def _last(runner: ModelRunner, items: Sequence[BatchItem], k: int = 0) -> np.ndarray:
    """The logits row of item `k` of one step (every item wanting its last token's)."""
    out = runner.execute(items)
    return np.array(out[k], copy=True)


def _differs(a: np.ndarray, b: np.ndarray) -> float:
    """0.0 when bit-identical, else the largest difference (inf when either holds a non-finite value)."""
    if np.array_equal(a.view(np.uint32), b.view(np.uint32)):
        return 0.0
    d = np.abs(a.astype(np.float64) - b.astype(np.float64))
    return float(np.nanmax(d)) if np.isfinite(d).any() else float("inf")


def _probe(runner: ModelRunner, toks: list[int], slots: int) -> Invariance:
    n = len(toks)
    failures: list[str] = []

    def check(name: str, a: np.ndarray, b: np.ndarray) -> bool:
        d = _differs(a, b)
        if d and not failures:
            failures.append(f"{name}: logits differ by up to {d:.3g}")
        return not d

    def reset() -> None:
        for s in range(slots):
            runner.clear(s)

    reset()
    alone = _last(runner, [BatchItem(0, toks, 0, prompt=True)])
    nxt = int(np.argmax(alone))
    decode_alone = _last(runner, [BatchItem(0, [nxt], n)])

    # batching: beside other prompts (each another length), then beside other decode tokens
    batching = True
    if slots > 1:
        reset()
        others = [BatchItem(s, toks[s:s + 2], 0, prompt=True) for s in range(1, slots)]  # short: the probe is cheap
        company = _last(runner, [BatchItem(0, toks, 0, prompt=True), *others])
        batching = check("a prompt beside others", alone, company)
        decoded_company = runner.execute([BatchItem(0, [nxt], n),
                                          *(BatchItem(o.slot, [nxt], len(o.token_ids)) for o in others)])
        batching = check("a decode token beside others", decode_alone, np.array(decoded_company[0])) and batching

    # chunking: pieces of 2, 3, 4 and the rest (never one: the scheduler makes no one-token prompt piece)
    reset()
    pos, piece = 0, None
    for size in (2, 3, 4, n - 9):
        piece = _last(runner, [BatchItem(0, toks[pos:pos + size], pos, prompt=True)])
        pos += size
    assert piece is not None
    chunking = check("a prompt prefilled in pieces", alone, piece)

    # decoded: one token a step, every row kept; then one call with every row (verification)
    reset()
    rows = [_last(runner, [BatchItem(0, [t], i)]) for i, t in enumerate(toks)]
    decoded = check("a prompt decoded one token a step", alone, rows[-1])
    reset()
    runner.execute([BatchItem(0, toks[:-4], 0, want_logits=False, prompt=True)])
    verified = runner.execute([BatchItem(0, toks[-4:], n - 4, logits_all=True)])
    drafts = all([check(f"verification row {i}", rows[n - 4 + i], np.array(verified[i])) for i in range(4)])
    return Invariance(batching, chunking, decoded, drafts, failures[0] if failures else "")


__all__ = ["Invariance", "probe", "probe_tokens"]
