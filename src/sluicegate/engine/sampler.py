"""Sampling from a step's logits in numpy.

Determinism: a seeded stream draws step `i` from `default_rng([seed, i])`, which depends on nothing but the
seed and the step, so the same request gives the same tokens alone, batched, or in another process. Every
choice below is a pure function of the row's logits and that draw (ties go to the lower token id).

Cost: greedy rows are one vectorised argmax, over the runner's rows as they are (no copy) when every row is
greedy. A greedy row whose only adjustment is a sparse `logit_bias` (say, a banned end-of-text) is not
copied either: its best token is the row's argmax or one of the biased ids, compared in float32 exactly as
the biased row would be. A greedy constrained row (no logprobs) asks its constraint
whether its best token is allowed and masks the vocabulary only when it is not: the best allowed token is
the same either way (argmax takes the lowest id among equal maxima, and so does the masked argmax when
that token is allowed), and a grammar allowing the model's choice is the common case. A sampled row costs
O(vocab) comparisons and one float32 exponential per surviving candidate: top-k and min-p are thresholds
on the logits (a partition, never a sort of the vocabulary) and top-p sorts only the most likely
candidates. Filters apply in the order temperature, top-k, min-p, top-p, each to the survivors of the one
before.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from sluicegate.engine.types import Constraint, SamplingParams, TokenLogprob

F32 = npt.NDArray[np.float32]
Ids = npt.NDArray[np.intp]


@dataclass(slots=True)
class SampleRow:
    """What the sampler needs about one sequence at one step."""

    params: SamplingParams
    seed: int
    step: int  # index of the token being sampled (0 for the first generated token)
    output_ids: Sequence[int]
    constraint: Constraint | None = None


def _apply_bias(logits: F32, bias: Mapping[int, float]) -> F32:
    logits[np.fromiter(bias.keys(), dtype=np.int64)] += np.fromiter(bias.values(), dtype=np.float32)
    return logits


def _apply_penalties(logits: F32, row: SampleRow) -> F32:
    p = row.params
    if p.logit_bias:
        _apply_bias(logits, p.logit_bias)
    if (p.presence_penalty or p.frequency_penalty) and len(row.output_ids):
        ids, counts = np.unique(np.asarray(row.output_ids, dtype=np.int64), return_counts=True)
        logits[ids] -= p.presence_penalty + p.frequency_penalty * counts.astype(np.float32)
    return logits


_NEG_INF = np.float32(-np.inf)


def _masked(logits: F32, constraint: Constraint) -> F32:
    """A new row with the tokens the constraint refuses at -inf (`logits` is left as it was)."""
    mask = constraint.allowed()
    return logits if mask is None else np.where(mask, logits, _NEG_INF)


def _log_softmax(x: F32) -> F32:
    m = np.max(x)
    shifted = x - m
    return shifted - np.log(np.sum(np.exp(shifted)))  # type: ignore[no-any-return]


_F32_MAX = float(np.finfo(np.float32).max)
_CUTOFF = 40.0  # a token less likely than e^-40 times the most likely one is never drawn (mass < 1e-12)


def _top(probs: F32, k: int) -> Ids:
    """Indices of the `k` largest of `probs`, by probability (descending), ties by lower index."""
    idx: Ids
    if k < len(probs):
        kth = np.partition(probs, len(probs) - k)[len(probs) - k]
        above = np.flatnonzero(probs > kth)
        idx = np.concatenate((above, np.flatnonzero(probs == kth)[: k - len(above)]))
    else:
        idx = np.arange(len(probs))
    return idx[np.lexsort((idx, -probs[idx]))]


def _filtered(x: F32, p: SamplingParams) -> tuple[Ids, F32]:
    """Candidates in id order with their unnormalised probabilities, after top-k, min-p and top-p in turn.

    Top-k and min-p are thresholds on the logits (no exponentials over the vocabulary); top-p takes the
    most likely survivors until their share of the survivors' mass reaches `top_p`, trying the top 64, then
    1,024, before it sorts them all.
    """
    t = p.temperature
    m = float(np.max(x))
    floor = m - _CUTOFF * t
    if p.min_p > 0.0:
        floor = max(floor, m + t * float(np.log(p.min_p)))
    kth = None
    if 0 < p.top_k < len(x):
        kth = float(np.partition(x, len(x) - p.top_k)[len(x) - p.top_k])
        floor = max(floor, kth)
    cand = np.flatnonzero(x >= floor)
    if kth is not None and len(cand) > p.top_k:  # ties at the k-th value: the lower ids stay
        vals = x[cand]
        above = cand[vals > kth]
        cand = np.sort(np.concatenate((above, cand[vals == kth][: p.top_k - len(above)])))
    if t * _F32_MAX > 1.0:
        probs = np.exp((x[cand] - np.float32(m)) * np.float32(1.0 / t))
    else:  # 1/t overflows float32 (t under 3e-39): divide instead, in float64; the best token keeps exp(0) = 1
        with np.errstate(over="ignore"):
            probs = np.exp((x[cand] - m).astype(np.float64) / t).astype(np.float32)
    if p.top_p < 1.0:
        total = float(probs.sum(dtype=np.float64))
        for size in (64, 1024, len(cand)):
            head = _top(probs, min(size, len(cand)))
            cum = np.cumsum(probs[head], dtype=np.float64) / total
            if cum[-1] >= p.top_p or len(head) == len(cand):
                break
        keep = np.sort(head[: int(np.searchsorted(cum, p.top_p, side="left")) + 1])
        cand, probs = cand[keep], probs[keep]
    return cand, probs


def _sample_row(logits: F32, row: SampleRow) -> int:
    """Inverse-CDF draw over the candidates in id order, with one uniform from `(seed, step)`."""
    cand, probs = _filtered(logits, row.params)
    cum = np.cumsum(probs, dtype=np.float64)
    u = np.random.default_rng([row.seed, row.step]).random() * cum[-1]
    return int(cand[min(int(np.searchsorted(cum, u, side="right")), len(cand) - 1)])


def _logprob(raw: F32, token: int, n_top: int) -> TokenLogprob:
    lp = _log_softmax(raw)
    top: tuple[tuple[int, float], ...] = ()
    if n_top > 0:
        idx = np.argpartition(-lp, n_top)[:n_top] if n_top < len(lp) else np.arange(len(lp))
        idx = idx[np.argsort(-lp[idx], kind="stable")]
        top = tuple((int(i), float(lp[i])) for i in idx)
    return TokenLogprob(token_id=token, logprob=float(lp[token]), top=top)


def _greedy_biased(row: F32, bias: Mapping[int, float]) -> int:
    """argmax(row + bias) without copying the row: the unbiased argmax or a biased id (lowest id on ties)."""
    best = int(np.argmax(row))
    if best in bias:  # the model's favourite is biased: the runner-up is unknown, so do it in full
        return int(np.argmax(_apply_bias(row.copy(), bias)))
    val = row[best]
    for tid, b in bias.items():
        v = row[tid] + np.float32(b)
        if v > val or (v == val and tid < best):
            best, val = tid, v
    return best


def sample(logits: F32, rows: Sequence[SampleRow]) -> tuple[list[int], list[TokenLogprob | None]]:
    """Sample one token per row of `logits`; logprobs where asked (of the penalised, unscaled logits)."""
    tokens = [0] * len(rows)
    logprobs: list[TokenLogprob | None] = [None] * len(rows)
    adjusted: dict[int, F32] = {}
    check_best: list[int] = []  # greedy constrained rows without logprobs: masked only if their best is refused
    biased: set[int] = set()  # greedy rows whose only adjustment is a logit bias: no copy of the row
    for i, row in enumerate(rows):
        p = row.params
        if (p.greedy and p.logit_bias and not (p.presence_penalty or p.frequency_penalty)
                and row.constraint is None and p.logprobs is None):
            biased.add(i)
            tokens[i] = _greedy_biased(logits[i], p.logit_bias)
            continue
        if p.logit_bias or p.presence_penalty or p.frequency_penalty:
            adjusted[i] = _apply_penalties(logits[i].copy(), row)
        if row.constraint is not None:
            if p.greedy and p.logprobs is None:
                check_best.append(i)
            else:
                adjusted[i] = _masked(adjusted[i] if i in adjusted else logits[i], row.constraint)

    def view(i: int) -> F32:
        return adjusted[i] if i in adjusted else logits[i]

    greedy = [i for i, r in enumerate(rows) if r.params.greedy and i not in biased]
    if greedy:
        if adjusted:
            block = np.stack([view(i) for i in greedy])
        else:
            block = logits if len(greedy) == len(logits) else logits[greedy]
        for i, t in zip(greedy, np.argmax(block, axis=1), strict=True):
            tokens[i] = int(t)
    for i in check_best:
        constraint = rows[i].constraint
        assert constraint is not None
        if not constraint.allows(tokens[i]):
            adjusted[i] = _masked(view(i), constraint)
            tokens[i] = int(np.argmax(adjusted[i]))
    for i, row in enumerate(rows):
        if not row.params.greedy:
            tokens[i] = _sample_row(view(i), row)
        if row.params.logprobs is not None:
            logprobs[i] = _logprob(view(i), tokens[i], row.params.logprobs)
    return tokens, logprobs
