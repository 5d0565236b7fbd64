"""Sampling from a step's logits in numpy.

Determinism: a seeded stream draws step `i` from `default_rng([seed, i])`, which depends on nothing but the
seed and the step, so the same request gives the same tokens alone, batched, or in another process. Every
choice below is a pure function of the row's logits and that draw (ties go to the lower token id).

Cost: greedy rows are one vectorised argmax; plain temperature rows (no top-k/top-p/min-p) are one
vectorised softmax-and-cumsum over all such rows; filtered rows use a partition (O(vocab)), never a full sort
of the vocabulary, unless top-p needs more than the 1,024 most likely tokens.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from sluicegate.engine.types import Constraint, SamplingParams, TokenLogprob

F32 = npt.NDArray[np.float32]
F64 = npt.NDArray[np.float64]
Ids = npt.NDArray[np.intp]


@dataclass(slots=True)
class SampleRow:
    """What the sampler needs about one sequence at one step."""

    params: SamplingParams
    seed: int
    step: int  # index of the token being sampled (0 for the first generated token)
    output_ids: Sequence[int]
    constraint: Constraint | None = None


def _apply_penalties(logits: F32, row: SampleRow) -> F32:
    p = row.params
    if p.logit_bias:
        ids = np.fromiter(p.logit_bias.keys(), dtype=np.int64)
        logits[ids] += np.fromiter(p.logit_bias.values(), dtype=np.float32)
    if (p.presence_penalty or p.frequency_penalty) and len(row.output_ids):
        ids, counts = np.unique(np.asarray(row.output_ids, dtype=np.int64), return_counts=True)
        logits[ids] -= p.presence_penalty + p.frequency_penalty * counts.astype(np.float32)
    if row.constraint is not None:
        mask = row.constraint.allowed()
        if mask is not None:
            logits[~mask] = -np.inf
    return logits


def _log_softmax(x: F32) -> F32:
    m = np.max(x)
    shifted = x - m
    return shifted - np.log(np.sum(np.exp(shifted)))  # type: ignore[no-any-return]


def _top(p: F64, cand: Ids, k: int) -> Ids:
    """The `k` most likely of `cand`, ordered by probability (descending), ties by lower id."""
    if k < len(cand):
        vals = p[cand]
        kth = np.partition(vals, len(vals) - k)[len(vals) - k]
        above = cand[vals > kth]
        cand = np.concatenate((above, cand[vals == kth][: k - len(above)]))
    return cand[np.lexsort((cand, -p[cand]))]


def _filtered(x: F64, p: SamplingParams) -> tuple[Ids, F64]:
    """Candidates after top-k, top-p and min-p, in id order, with their (unnormalised) probabilities.

    `x` holds temperature-scaled logits. Top-p counts mass within the top-k set; min-p is relative to the
    most likely token. All three keep a prefix of the probability-ordered vocabulary, so they commute.
    """
    probs = np.exp(x - np.max(x))
    cand = np.flatnonzero(probs > 0.0)
    if p.top_k > 0:
        cand = _top(probs, cand, p.top_k)
    if p.min_p > 0.0:
        cand = cand[probs[cand] >= p.min_p]  # the maximum is exactly 1.0
    if p.top_p < 1.0:
        total = float(probs[cand].sum())
        for m in (64, 1024, len(cand)):
            head = _top(probs, cand, min(m, len(cand)))
            cum = np.cumsum(probs[head]) / total
            if cum[-1] >= p.top_p or len(head) == len(cand):
                break
        cand = head[: int(np.searchsorted(cum, p.top_p, side="left")) + 1]
    cand = np.sort(cand)
    return cand, probs[cand]


def _draw(row: SampleRow, cum: F64) -> int:
    """Inverse-CDF draw: the index whose cumulative mass first exceeds a uniform draw."""
    u = np.random.default_rng([row.seed, row.step]).random() * cum[-1]
    return min(int(np.searchsorted(cum, u, side="right")), len(cum) - 1)


def _sample_filtered(logits: F32, row: SampleRow) -> int:
    cand, w = _filtered(logits.astype(np.float64) / row.params.temperature, row.params)
    return int(cand[_draw(row, np.cumsum(w))])


def _sample_plain(logits: F32, rows: Sequence[SampleRow]) -> list[int]:
    """Temperature-only rows, all at once: softmax numerators and their cumulative sums in one pass."""
    temps = np.array([r.params.temperature for r in rows], dtype=np.float64)[:, None]
    x = logits.astype(np.float64) / temps
    x -= np.max(x, axis=1, keepdims=True)
    np.exp(x, out=x)
    np.cumsum(x, axis=1, out=x)
    return [_draw(r, x[i]) for i, r in enumerate(rows)]


def _logprob(raw: F32, token: int, n_top: int) -> TokenLogprob:
    lp = _log_softmax(raw)
    top: tuple[tuple[int, float], ...] = ()
    if n_top > 0:
        idx = np.argpartition(-lp, n_top)[:n_top] if n_top < len(lp) else np.arange(len(lp))
        idx = idx[np.argsort(-lp[idx], kind="stable")]
        top = tuple((int(i), float(lp[i])) for i in idx)
    return TokenLogprob(token_id=token, logprob=float(lp[token]), top=top)


def _is_plain(p: SamplingParams) -> bool:
    return p.top_k == 0 and p.top_p >= 1.0 and p.min_p <= 0.0


def sample(logits: F32, rows: Sequence[SampleRow]) -> tuple[list[int], list[TokenLogprob | None]]:
    """Sample one token per row of `logits`; logprobs where asked (of the penalised, unscaled logits)."""
    tokens = [0] * len(rows)
    logprobs: list[TokenLogprob | None] = [None] * len(rows)
    adjusted: dict[int, F32] = {}
    for i, row in enumerate(rows):
        p = row.params
        if p.logit_bias or p.presence_penalty or p.frequency_penalty or row.constraint is not None:
            adjusted[i] = _apply_penalties(logits[i].copy(), row)

    def view(i: int) -> F32:
        return adjusted[i] if i in adjusted else logits[i]

    greedy = [i for i, r in enumerate(rows) if r.params.greedy]
    plain = [i for i, r in enumerate(rows) if not r.params.greedy and _is_plain(r.params)]
    if greedy:
        block = np.stack([view(i) for i in greedy]) if adjusted else logits[greedy]
        for i, t in zip(greedy, np.argmax(block, axis=1), strict=True):
            tokens[i] = int(t)
    if plain:
        block = np.stack([view(i) for i in plain]) if adjusted else logits[plain]
        for i, t in zip(plain, _sample_plain(block, [rows[i] for i in plain]), strict=True):
            tokens[i] = t
    for i, row in enumerate(rows):
        if not row.params.greedy and not _is_plain(row.params):
            tokens[i] = _sample_filtered(view(i), row)
        if row.params.logprobs is not None:
            logprobs[i] = _logprob(view(i), tokens[i], row.params.logprobs)
    return tokens, logprobs
