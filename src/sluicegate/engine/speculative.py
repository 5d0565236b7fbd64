"""Prompt-lookup (n-gram) drafting for opt-in speculative decoding (docs/engine.md).

No second model: a greedy sequence's next tokens are guessed by finding the most recent earlier occurrence of
its last n tokens in its own prompt and output, and proposing the tokens that followed it. The engine then
feeds the last token and the drafts as one item, reads the logits of every position, and keeps the longest
prefix of drafts that matches the greedy choice plus the one token the model chose after it. Knob names follow
vLLM's `ngram` method (`num_speculative_tokens`, `prompt_lookup_max`, `prompt_lookup_min`).

Two ways to run it. A fixed `K` (`--speculative-ngram K`) drafts up to K tokens whenever a match is found.
`DraftPolicy` (the default, `--speculative-ngram auto`, only where verification is exact) drafts only what is
expected to pay: on a CPU a draft row costs a large share of a one-token step (each extra row of a small step
about half of it on two cores: docs/benchmarks.md), so a wrong draft is not free, and as more sequences share
the step a row's share of the step's useful work grows.

Hand-written because it is a few lines of numpy over a sequence the engine already holds, and the cost model
is this engine's own (vLLM's and llama.cpp's n-gram drafting have fixed lengths).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from sluicegate.backends.base import ModelRunner

if TYPE_CHECKING:
    from sluicegate.engine.scheduler import Chunk


def propose(context: Sequence[int], k: int, n_max: int, n_min: int = 1) -> list[int]:
    """Up to `k` tokens that followed the most recent earlier occurrence of `context`'s last n tokens.

    n goes from `n_max` down to `n_min`; the first n with a match wins (a longer match predicts better).
    The occurrence must start before the tail itself and be followed by at least one token; the proposal may
    run into the tail (a repeating pattern continues). Empty when nothing matches or `k` < 1.
    """
    return propose_n(context, k, n_max, n_min)[0]


def propose_n(context: Sequence[int], k: int, n_max: int, n_min: int = 1) -> tuple[list[int], int]:
    """`propose`, and the length of the n-gram that matched (0: none)."""
    total = len(context)
    if k < 1 or total < 2:
        return [], 0
    arr = np.asarray(context, dtype=np.int64)
    ends = np.flatnonzero(arr[: total - 1] == arr[total - 1])  # earlier positions holding the last token
    for n in range(min(n_max, total - 1), max(n_min, 1) - 1, -1):
        hits = ends[ends >= n - 1]
        for d in range(1, n):  # the d-th token before each candidate end must match the tail's
            hits = hits[arr[hits - d] == arr[total - 1 - d]]
        if len(hits):
            start = int(hits[-1]) + 1
            return [int(t) for t in arr[start : start + k]], n
    return [], 0


@dataclass(slots=True)
class DraftRecord:
    """One sequence's drafting history: draft tokens the model agreed with, and disagreements seen."""

    hits: int = 0
    misses: int = 0


class DraftPolicy:
    """How many drafts a sequence gets this step (`--speculative-ngram auto`).

    A step of B decode rows costs about `lone * (1 + c * (B - 1))`: `lone` a one-row step, `c` what each further
    row adds as a share of it; both are measured from the steps that carry decode tokens only (`observe_step`;
    `c` starts at `row_cost`). The step yields B tokens, so a draft row pays when the chance that it is kept is
    at least `c * B / (1 + c * (B - 1))` (the tokens a row of the step yields now): at one sequence that is `c`,
    at four 0.8 with `c` = 0.5; the bar asks `margin` (1.2) times that. Drafts are kept as a prefix, so the i-th
    draft is kept with chance p^i, p the sequence's per-token agreement rate; drafts are fed while p^i is over
    the bar, with p taken one standard error low (`sure_rate`).

    A step whose row count differs from the step before costs more again: llama.cpp reuses the previous step's
    compute graph only for a batch of the same shape, and rebuilds it otherwise (a one-row step right after a
    two-row one took 2.1-2.7 ms more than one after a one-row step, on a 14-16 ms step). A draft that changes
    the step's shape pays for two rebuilds (this step's, and the one back), `switch_s`, measured from the
    one-row steps that follow another shape. So the drafts of a step that changes shape are fed only if their
    expected kept tokens are worth `margin` times their rows and the two rebuilds together (`worth`): a lone
    likely draft in a stream of plain steps is not, a run of drafted steps of the same shape is.

    p is learnt from every decode step of a greedy sequence, drafted or not: a proposal that was not fed is
    checked against the token the model chose (`observe`), so a sequence whose drafts are never fed still
    learns when they would have been right. It blends the sequence's own record with the engine-wide rate for
    matches of the same n-gram length (`prior` pseudo-tokens of it; the engine-wide counts decay so the rate
    follows the traffic).
    """

    def __init__(
        self, k_max: int, *, row_cost: float = 0.5, switch_cost: float = 0.15, weight: float = 0.05,
        relax: float = 0.01, prior: float = 4.0, decay: float = 0.995, margin: float = 1.2,
    ) -> None:
        self.k_max = k_max
        self.row_cost = row_cost  # c before any step with several decode rows was timed, and what it relaxes to
        self.switch_cost = switch_cost  # a graph rebuild as a share of a one-row step, before one was timed
        self.weight, self.relax, self.prior, self.decay, self.margin = weight, relax, prior, decay, margin
        self.lone_s: float | None = None  # a one-row decode step after another (exponentially weighted average)
        self.row_s: float | None = None  # what each further decode row adds
        self.switch_s: float | None = None  # what a step of a new shape adds (llama.cpp rebuilds its graph)
        self.last_rows = 0  # the previous step's decode rows (0: it was not a decode-only step)
        self.timed = True  # learn the costs from the steps' times (False: keep the priors; tests)
        self._rates: dict[int, list[float]] = {}  # n-gram length -> [kept, refused] draft tokens, decaying

    def observe_step(self, rows: int, seconds: float) -> None:
        """A step took `seconds`: one of `rows` decode tokens (drafts included) and nothing else, or, with
        `rows` 0, any other step (it only changes the shape the next step is compared with).

        Each step moves the averages a little (`weight`), so one step slowed by a neighbour does not decide;
        a further row's cost is capped at 1.5 one-row steps per observation for the same reason. One-row steps
        also pull the row cost back towards `row_cost` (`relax`): at one sequence only drafted steps measure
        it, and an estimate that stopped all drafting would otherwise never be checked again."""
        w, changed = self.weight, rows != self.last_rows
        self.last_rows = rows
        if not self.timed:
            return
        if rows == 1 and (not changed or self.lone_s is None):
            self.lone_s = seconds if self.lone_s is None else self.lone_s + w * (seconds - self.lone_s)
            if self.row_s is not None:
                self.row_s += self.relax * (self.row_cost * self.lone_s - self.row_s)
        elif rows == 1 and self.lone_s is not None:
            extra = min(max(0.0, seconds - self.lone_s), self.lone_s)
            self.switch_s = extra if self.switch_s is None else self.switch_s + w * (extra - self.switch_s)
        elif rows > 1 and self.lone_s is not None:
            rebuilt = self.switch * self.lone_s if changed else 0.0
            extra = min(max(0.0, seconds - self.lone_s - rebuilt) / (rows - 1), 1.5 * self.lone_s)
            if self.row_s is None:
                self.row_s = self.row_cost * self.lone_s
            self.row_s += w * (extra - self.row_s)

    @property
    def switch(self) -> float:
        """A graph rebuild, as a share of a one-row step."""
        if self.switch_s is not None and self.lone_s:
            return self.switch_s / self.lone_s
        return self.switch_cost

    def worth(self, decoding: int, drafts: int, kept: float) -> bool:
        """Whether `drafts` draft rows expected to keep `kept` tokens pay in a step of `decoding` decode rows
        whose shape they change: the kept tokens at the step's rate against the rows and two rebuilds (all in
        one-row steps)."""
        c = self.cost
        per_token = (1.0 + c * (decoding - 1)) / decoding
        return kept * per_token >= self.margin * (drafts * c + 2.0 * self.switch)

    @property
    def cost(self) -> float:
        """c: a further decode row's cost as a share of a one-row step."""
        if self.lone_s and self.row_s is not None:
            return self.row_s / self.lone_s
        return self.row_cost

    def bar(self, decoding: int) -> float:
        """The chance a draft row must have of being kept to pay, in a step of `decoding` decode rows, times
        `margin`: the rate and the cost are both estimates, and a draft expected to return barely its cost is
        as likely to lose as to win."""
        c = self.cost
        return self.margin * c * decoding / (1.0 + c * (decoding - 1))

    def rate(self, n: int, record: DraftRecord) -> float:
        """p: the chance the sequence's next draft token is kept, for a match of n tokens."""
        kept, refused = self._rates.get(n, (1.0, 1.0))
        engine_wide = kept / (kept + refused)
        return (record.hits + self.prior * engine_wide) / (record.hits + record.misses + self.prior)

    def sure_rate(self, n: int, record: DraftRecord) -> float:
        """p less one standard error of it: what drafts are sized by, so a sequence is drafted on evidence (a
        reply whose guesses come right four times in ten is not drafted because a few went right)."""
        p = self.rate(n, record)
        seen = record.hits + record.misses + self.prior
        return max(0.0, p - math.sqrt(p * (1.0 - p) / seen))

    def how_many(self, p: float, bar: float, cap: int) -> int:
        """Drafts to feed: the largest i <= cap with p^i >= bar."""
        k, q = 0, p
        while k < min(cap, self.k_max) and q >= bar:
            k, q = k + 1, q * p
        return k

    def observe(self, n: int, record: DraftRecord, proposal: Sequence[int], chosen: Sequence[int]) -> None:
        """The model chose `chosen` (one token, or the accepted drafts and the one after them) where `proposal`
        (an n-gram match's drafts, fed or not) had guessed: agreements count as kept, the first disagreement
        (if the tokens reach one) as refused."""
        kept = accepted(proposal, chosen)
        refused = int(kept < min(len(proposal), len(chosen)))
        record.hits += kept
        record.misses += refused
        rates = self._rates.setdefault(n, [1.0, 1.0])
        rates[0] = rates[0] * self.decay + kept
        rates[1] = rates[1] * self.decay + refused


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
