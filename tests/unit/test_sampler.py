"""The sampler: greedy, seeded replay alone or batched, filters, penalties, masks, logprobs."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
import pytest

from sluicegate.engine.sampler import SampleRow, sample
from sluicegate.engine.types import SamplingParams

V = 1000


def logits(seed: int, rows: int = 1) -> npt.NDArray[np.float32]:
    return (np.random.default_rng(seed).standard_normal((rows, V)) * 3).astype(np.float32)


def row(step: int = 0, seed: int = 1, out: tuple[int, ...] = (), **params: object) -> SampleRow:
    return SampleRow(SamplingParams(**params), seed, step, list(out))  # type: ignore[arg-type]


def one(x: npt.NDArray[np.float32], r: SampleRow) -> int:
    return sample(x[None, :] if x.ndim == 1 else x, [r])[0][0]


def softmax(x: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
    e = np.exp(x - x.max())
    return e / e.sum()  # type: ignore[no-any-return]


def test_greedy_is_argmax_and_ties_go_to_the_lower_id() -> None:
    x = logits(0, 3)
    toks, lps = sample(x, [row(temperature=0.0)] * 3)
    assert toks == [int(np.argmax(r)) for r in x] and lps == [None] * 3
    flat = np.zeros((1, V), np.float32)
    flat[0, [7, 3, 9]] = 5.0
    assert sample(flat, [row(temperature=0.0)])[0] == [3]


PARAMS: list[dict[str, object]] = [
    {"temperature": 0.0},
    {"temperature": 0.8},
    {"temperature": 1.3, "top_k": 40},
    {"temperature": 1.0, "top_p": 0.9},
    {"temperature": 0.7, "min_p": 0.05, "top_p": 0.95, "top_k": 50},
    {"temperature": 1.0, "presence_penalty": 1.5, "frequency_penalty": 0.5},
    {"temperature": 0.0, "logit_bias": {5: 100.0}},
]


def test_a_seeded_row_gives_the_same_token_alone_or_in_any_batch() -> None:
    x = logits(1, len(PARAMS))
    rows = [row(step=4, seed=100 + i, out=(1, 2, 2), **p) for i, p in enumerate(PARAMS)]
    together = sample(x, rows)[0]
    alone = [one(x[i], r) for i, r in enumerate(rows)]
    assert together == alone
    reordered = sample(x[::-1].copy(), rows[::-1])[0]
    assert reordered == together[::-1]
    assert together[-1] == 5


def test_a_tiny_positive_temperature_is_near_greedy_and_never_fails_the_step() -> None:
    """1/t overflowed float32 below t = 3e-39 (a schema-valid `temperature`, found by the fuzz test): the step
    failed, and with it every sequence batched beside the request."""
    x = logits(7, 3)
    rows = [row(seed=1, temperature=t) for t in (2.5e-234, 5e-324, 1e-30)]
    assert sample(x, rows)[0] == [int(np.argmax(x[i])) for i in range(3)]


def test_seed_and_step_decide_the_draw() -> None:
    x = logits(2)[0]
    draws = [one(x, row(step=s, seed=9, temperature=1.0)) for s in range(40)]
    assert draws == [one(x, row(step=s, seed=9, temperature=1.0)) for s in range(40)]
    assert len(set(draws)) > 5
    other_seed = [one(x, row(step=s, seed=10, temperature=1.0)) for s in range(40)]
    assert other_seed != draws


def test_plain_sampling_follows_the_softmax() -> None:
    x = np.full(V, -50.0, np.float32)
    x[[10, 20, 30]] = [0.0, np.log(2.0), np.log(7.0)]
    counts = np.bincount([one(x, row(step=s, seed=s, temperature=1.0)) for s in range(3000)], minlength=V)
    assert set(np.flatnonzero(counts)) <= {10, 20, 30}
    assert np.allclose(counts[[10, 20, 30]] / 3000, [0.1, 0.2, 0.7], atol=0.03)
    hot = np.bincount([one(x, row(step=s, seed=s, temperature=2.0)) for s in range(3000)], minlength=V)
    assert hot[10] > counts[10]  # a higher temperature flattens


def test_top_k_top_p_and_min_p_keep_the_right_candidates() -> None:
    x = logits(3)[0]
    p = softmax(x.astype(np.float64))
    order = np.argsort(-p, kind="stable")
    top5 = set(order[:5].tolist())
    assert {one(x, row(step=s, temperature=1.0, top_k=5)) for s in range(300)} <= top5
    nucleus_size = int(np.searchsorted(np.cumsum(p[order]), 0.5)) + 1
    nucleus = set(order[:nucleus_size].tolist())
    assert {one(x, row(step=s, temperature=1.0, top_p=0.5)) for s in range(300)} <= nucleus
    keep = set(np.flatnonzero(p >= 0.2 * p.max()).tolist())
    assert {one(x, row(step=s, temperature=1.0, min_p=0.2)) for s in range(300)} <= keep
    for narrow in ({"top_k": 1}, {"top_p": 1e-6}, {"min_p": 1.0}):
        assert one(x, row(temperature=1.5, **narrow)) == int(np.argmax(x))


def test_top_p_beyond_the_first_candidates_still_works() -> None:
    x = np.zeros(V, np.float32)  # uniform: the nucleus needs 900 of 1000 tokens
    drawn = {one(x, row(step=s, temperature=1.0, top_p=0.9)) for s in range(400)}
    assert len(drawn) > 250 and max(drawn) < 900  # ties go to the lower ids


def test_penalties_and_bias_change_the_logits() -> None:
    x = np.zeros(V, np.float32)
    x[4] = 1.0
    assert one(x, row(temperature=0.0)) == 4
    assert one(x, row(temperature=0.0, out=(4,), presence_penalty=2.0)) != 4
    assert one(x, row(temperature=0.0, out=(4, 4, 4), frequency_penalty=0.5)) != 4
    assert one(x, row(temperature=0.0, logit_bias={4: -5.0, 8: 0.5})) == 8


class Mask:
    """A fixed set of allowed tokens; counts how often the whole mask and a single token were asked for."""

    def __init__(self, allowed: list[int] | npt.NDArray[np.bool_]) -> None:
        if isinstance(allowed, np.ndarray):
            self.mask = allowed
        else:
            self.mask = np.zeros(V, np.bool_)
            self.mask[allowed] = True
        self.masks = 0
        self.checks = 0

    def allowed(self) -> npt.NDArray[np.bool_] | None:
        self.masks += 1
        return self.mask

    def allows(self, token_id: int) -> bool:
        self.checks += 1
        return bool(self.mask[token_id])

    def accept(self, token_id: int) -> None:
        return None

    def is_complete(self) -> bool:
        return False


def test_a_constraint_mask_limits_every_kind_of_row() -> None:
    x = logits(4)[0]
    for params in PARAMS[:5]:
        r = SampleRow(SamplingParams(**params), 3, 0, [], Mask([11, 12]))  # type: ignore[arg-type]
        assert one(x, r) in {11, 12}


def test_a_greedy_row_builds_the_mask_only_when_its_best_token_is_refused() -> None:
    x = logits(6)[0]
    best = int(np.argmax(x))
    allowing = Mask([best, 3])
    assert one(x, SampleRow(SamplingParams(temperature=0.0), 1, 0, [], allowing)) == best
    assert (allowing.checks, allowing.masks) == (1, 0)
    refusing = Mask([3, 700])
    expected = 3 if x[3] >= x[700] else 700
    assert one(x, SampleRow(SamplingParams(temperature=0.0), 1, 0, [], refusing)) == expected
    assert (refusing.checks, refusing.masks) == (1, 1)
    with_logprobs = Mask([best, 3])  # logprobs are of the masked logits: the whole mask, as for a sampled row
    lp_row = SampleRow(SamplingParams(temperature=0.0, logprobs=1), 1, 0, [], with_logprobs)
    assert one(x, lp_row) == best and with_logprobs.masks == 1


@pytest.mark.parametrize("seed", range(20))
def test_checking_the_best_token_gives_the_masked_argmax(seed: int) -> None:
    """Against masking first, with ties (coarse logits), penalties, biases and masks of every density."""
    rng = np.random.default_rng(seed)
    x = np.round(rng.standard_normal((8, V)) * 2).astype(np.float32)  # many equal maxima
    params = [
        SamplingParams(temperature=0.0),
        SamplingParams(temperature=0.0, logit_bias={int(rng.integers(V)): 3.0}),
        SamplingParams(temperature=0.0, presence_penalty=1.0, frequency_penalty=0.5),
    ]
    rows, expected = [], []
    for i in range(len(x)):
        mask = rng.random(V) < [0.002, 0.05, 0.5, 0.99][i % 4]
        mask[rng.integers(V)] = True
        p = params[i % len(params)]
        out = [int(t) for t in rng.integers(0, V, 5)]
        ref = x[i].copy()
        if p.logit_bias:
            for t, b in p.logit_bias.items():
                ref[t] += b
        ids, counts = np.unique(out, return_counts=True)
        ref[ids] -= p.presence_penalty + p.frequency_penalty * counts.astype(np.float32)
        ref[~mask] = -np.inf
        expected.append(int(np.argmax(ref)))
        rows.append(SampleRow(p, 1, 5, out, Mask(mask)))
    assert sample(x, rows)[0] == expected


def test_logprobs_are_of_the_penalised_unscaled_logits() -> None:
    x = logits(5)[0]
    toks, lps = sample(x[None, :], [row(temperature=0.7, logprobs=3, seed=4)])
    lp = lps[0]
    assert lp is not None and lp.token_id == toks[0]
    ref = np.log(softmax(x.astype(np.float64)))
    assert lp.logprob == pytest.approx(ref[toks[0]], abs=1e-4)
    assert [t for t, _ in lp.top] == np.argsort(-ref, kind="stable")[:3].tolist()
    _, biased = sample(x[None, :], [row(temperature=0.0, logprobs=0, logit_bias={0: 50.0})])
    assert biased[0] is not None and biased[0].token_id == 0 and biased[0].logprob > -1e-3


def test_sampling_does_not_modify_the_logits() -> None:
    x = logits(6, 3)
    before = x.copy()
    rows = [row(temperature=0.0, logit_bias={1: 3.0}), row(temperature=1.0), row(temperature=0.9, top_k=3)]
    sample(x, rows)
    assert np.array_equal(x, before)


@pytest.mark.parametrize("seed", range(40))
def test_a_greedy_row_with_a_sparse_bias_picks_what_the_biased_row_would(seed: int) -> None:
    rng = np.random.default_rng(seed)
    x = logits(100 + seed)[0]
    best = int(np.argmax(x))
    ids = rng.choice(V, size=int(rng.integers(1, 6)), replace=False).tolist()
    if seed % 4 == 0:
        ids.append(best)  # the model's favourite is biased (banned end-of-text at the end of a reply)
    if seed % 4 == 1:  # a biased id lands exactly on the best value: the lower id wins
        x[ids[0]] = x[best] - 2.0
    bias = {int(t): float(rng.choice([-100.0, -2.0, 0.5, 2.0, 7.0])) for t in ids}
    if seed % 4 == 1:
        bias[ids[0]] = 2.0
    dense = x.copy()
    dense[list(bias)] += np.array(list(bias.values()), np.float32)
    assert one(x, row(temperature=0.0, logit_bias=bias)) == int(np.argmax(dense))


def test_greedy_rows_are_read_in_place() -> None:
    x = logits(7, 4)
    x.setflags(write=False)  # a view of the runner's buffer: the sampler must neither copy-modify nor write it
    toks, _ = sample(x, [row(temperature=0.0), row(temperature=0.0, logit_bias={3: 50.0})] * 2)
    assert toks == [int(np.argmax(x[0])), 3, int(np.argmax(x[2])), 3]
