"""Sampling from a step's logits in numpy.

Determinism: a seeded stream draws step `i` from `default_rng([seed, i])`, which depends on nothing but the
seed and the step, so the same request gives the same tokens alone, batched, or in another process.
Greedy rows are taken together with one vectorised argmax.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from sluicegate.engine.types import Constraint, SamplingParams, TokenLogprob

F32 = npt.NDArray[np.float32]


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


def _sample_one(logits: F32, row: SampleRow) -> int:
    p = row.params
    if p.greedy:
        return int(np.argmax(logits))
    scaled = logits.astype(np.float64) / p.temperature
    order = np.argsort(-scaled, kind="stable")
    if p.top_k > 0:
        order = order[: p.top_k]
    vals = scaled[order]
    probs = np.exp(vals - vals[0])
    probs /= probs.sum()
    keep = len(order)
    if p.top_p < 1.0:
        keep = int(np.searchsorted(np.cumsum(probs), p.top_p, side="left")) + 1
    if p.min_p > 0.0:
        keep = min(keep, int(np.count_nonzero(probs >= p.min_p * probs[0])))
    keep = max(1, min(keep, len(order)))
    probs = probs[:keep] / probs[:keep].sum()
    rng = np.random.default_rng([row.seed, row.step])
    return int(order[int(rng.choice(keep, p=probs))])


def _logprob(raw: F32, token: int, n_top: int) -> TokenLogprob:
    lp = _log_softmax(raw)
    top: tuple[tuple[int, float], ...] = ()
    if n_top > 0:
        idx = np.argpartition(-lp, n_top)[:n_top] if n_top < len(lp) else np.arange(len(lp))
        idx = idx[np.argsort(-lp[idx], kind="stable")]
        top = tuple((int(i), float(lp[i])) for i in idx)
    return TokenLogprob(token_id=token, logprob=float(lp[token]), top=top)


def sample(logits: F32, rows: Sequence[SampleRow]) -> tuple[list[int], list[TokenLogprob | None]]:
    """Sample one token per row of `logits`; logprobs where asked (of the penalised, unscaled logits)."""
    plain = [
        i for i, r in enumerate(rows)
        if r.params.greedy and not r.params.logit_bias and r.constraint is None
        and not r.params.presence_penalty and not r.params.frequency_penalty
    ]
    tokens = [0] * len(rows)
    if plain:
        for i, t in zip(plain, np.argmax(logits[plain], axis=1), strict=True):
            tokens[i] = int(t)
    plain_set = set(plain)
    logprobs: list[TokenLogprob | None] = [None] * len(rows)
    for i, row in enumerate(rows):
        needs_work = i not in plain_set
        if not needs_work and row.params.logprobs is None:
            continue
        adjusted = _apply_penalties(logits[i].copy(), row) if needs_work else logits[i]
        if needs_work:
            tokens[i] = _sample_one(adjusted, row)
        if row.params.logprobs is not None:
            logprobs[i] = _logprob(adjusted, tokens[i], row.params.logprobs)
    return tokens, logprobs
