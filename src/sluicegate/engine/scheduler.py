"""Continuous-batching scheduler. Pure Python: no model, no threads, no clock of its own.

Each step carries every decoding sequence's next token, then prompt chunks of prefilling sequences (oldest
first), then admits waiting requests while the step's token budget and free slots allow. A long prompt is
prefilled over several steps, so running streams keep getting a token every step (chunked prefill).

Chunk sizes follow the budget, not fixed boundaries. The runner computes a prompt token bit-identically
however the prompt is chunked and whatever else shares the step, provided no chunk is a single token: a
token computed alone in its sequence's micro-batch (a decode step) rounds differently (measured for llama.cpp
in docs/engine.md). So a prompt chunk is never one token and never leaves one token behind (only a one-token
prompt is computed as one), and chunking never changes an output. The prefix cache reuses any common prefix
of prompt tokens (rounded down to `block_size`, 1 by default), and of generated ones with `exact_replies`.

Waiting order (docs/engine.md): every interactive request before any batch one (batch work fills idle
capacity and is never promoted above interactive work); within the interactive class, the tenant with the
fewest running sequences first, then arrival order; within the batch class, requests that have waited longer
than `batch_aging_s` first (aging among batch requests only, so one tenant's flood cannot hold another's old
items back forever), then the tenant with the fewest running sequences, then arrival order.

Interactive prompts first: in a step where an interactive prompt prefills while batch sequences run, the batch
sequences sit that step out (at most every other step), so an arrival's first token waits for its own prefill
alone, not for the batch rows beside it (the TTFT of interactive requests under a batch job: docs/jobs.md).
"""

from __future__ import annotations

import enum
import itertools
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

from sluicegate.engine.kv_tier import KvTier
from sluicegate.engine.prefix_cache import KvOp, SlotTable
from sluicegate.engine.speculative import DraftPolicy, DraftRecord, accepted, propose, propose_n
from sluicegate.engine.types import EngineRequest, FinishReason, Priority


@dataclass(frozen=True, slots=True)
class SchedulerConfig:
    block_size: int = 1  # prefix reuse granularity in tokens: 1 reuses any common prefix (docs/engine.md)
    max_batch_tokens: int = 512  # tokens one step may carry (decode tokens + prompt chunks); bounds step time
    min_prefill_chunk: int = 16  # a prompt chunk shorter than this (unless it ends the prompt) waits a step
    max_waiting: int = 256  # requests allowed to wait for a slot; beyond it: 503 overloaded
    max_waiting_tokens: int = 1 << 20  # prompt tokens allowed to wait; beyond it: 503 overloaded
    batch_aging_s: float = 30.0  # a batch request waiting this long goes ahead of younger batch requests
    deadline_admission: bool = True  # refuse at submit what the measured speed says cannot meet its deadline
    speculative_ngram: int = 0  # fixed prompt-lookup drafts per greedy step (vLLM num_speculative_tokens); 0: none
    speculative_auto: int = 8  # with no fixed K: adaptive drafts, at most this many, where exact (0: off)
    prompt_lookup_max: int = 3  # longest n-gram matched to find drafts (tried first)
    prompt_lookup_min: int = 2  # shortest n-gram matched
    kv_cache_bytes: int | None = None  # host-memory KV tier budget (engine/kv_tier.py); None: 1/8 of RAM; 0: off


class SeqStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


_seq_counter = itertools.count()
_MAX_BAR = 0.9  # where a draft would need a better chance than this to pay, none is proposed (saves the lookups)


@dataclass(slots=True, eq=False)
class Seq:
    request: EngineRequest
    seed: int
    status: SeqStatus = SeqStatus.WAITING
    slot: int | None = None
    num_computed: int = 0  # positions whose KV the slot holds
    output_ids: list[int] = field(default_factory=list)
    cached_tokens: int = 0
    finish_reason: FinishReason | None = None
    first_scheduled: float | None = None
    first_token: float | None = None
    finished_at: float | None = None
    order: int = field(default_factory=lambda: next(_seq_counter))
    drafts: DraftRecord = field(default_factory=DraftRecord)  # adaptive drafting: how its guesses fared

    @property
    def prompt_len(self) -> int:
        return len(self.request.prompt_ids)

    @property
    def in_prefill(self) -> bool:
        return self.num_computed < self.prompt_len

    def pending_ids(self) -> list[int]:
        """Tokens the model has not seen yet."""
        ids = self.request.prompt_ids
        if self.num_computed < len(ids):
            return ids[self.num_computed :]
        return self.output_ids[self.num_computed - len(ids) :]


@dataclass(frozen=True, slots=True)
class Chunk:
    seq: Seq
    token_ids: list[int]
    start_pos: int
    want_logits: bool
    n_draft: int = 0  # speculative: the last `n_draft` token_ids are drafts; logits of every position wanted
    proposal: tuple[int, ...] = ()  # adaptive drafting: every draft proposed, fed or not (checked after the step)
    ngram: int = 0  # the proposal's n-gram length


@dataclass(slots=True)
class SchedulerOutput:
    kv_ops: list[KvOp] = field(default_factory=list)
    chunks: list[Chunk] = field(default_factory=list)
    expired: list[Seq] = field(default_factory=list)  # finished by deadline before this step

    @property
    def empty(self) -> bool:
        return not self.chunks


class Scheduler:
    def __init__(
        self, config: SchedulerConfig, n_slots: int, eos_ids: frozenset[int], *, exact_replies: bool = False,
        exact_drafts: bool | None = None, max_drafts: int | None = None, kv_tier: KvTier | None = None,
    ) -> None:
        """`exact_replies`: the runner computes a decoded token's KV exactly as a prefill would
        (`RunnerLimits.decoded_kv_exact`), so generated tokens join the prefix cache too. `exact_drafts`: drafts
        verified several in one item round as one-token decoding (`RunnerLimits.drafts_exact`; default:
        `exact_replies`), so adaptive drafting changes no output. `max_drafts`: most drafts a verification
        item may carry (`RunnerLimits.max_drafts`). `kv_tier`: where
        evicted slots' KV is saved and restored from (engine/kv_tier.py); the engine applies the saves."""
        if config.max_batch_tokens < n_slots + max(2, config.min_prefill_chunk):
            # every running sequence decodes every step, and a prompt must still make progress
            raise ValueError("max_batch_tokens must hold one token per slot plus a minimal prompt chunk")
        if min(config.speculative_ngram, config.speculative_auto) < 0 or not (
            1 <= config.prompt_lookup_min <= config.prompt_lookup_max
        ):
            raise ValueError("speculative_ngram and speculative_auto must be >= 0 and 1 <= prompt_lookup_min <= "
                             "prompt_lookup_max")
        self.config = config
        self.slots = SlotTable(n_slots, config.block_size, kv_tier)
        self.eos_ids = eos_ids
        self.exact_replies = exact_replies
        self.waiting: list[Seq] = []
        self.running: list[Seq] = []
        self.waiting_tokens = 0
        self._batch_held = False  # the last step held batch sequences back (engine: interactive prompts first)
        # adaptive drafting only where verifying drafts is exact
        exact = exact_replies if exact_drafts is None else exact_drafts
        self._max_drafts = max_drafts
        self.drafting = (
            DraftPolicy(config.speculative_auto)
            if exact and config.speculative_auto > 0 and not config.speculative_ngram else None
        )

    def withdraw(self, *, replies: bool, drafts: bool) -> None:
        """What a load-time probe found not exact is not reused (engine/core.py): decoded tokens stay out of the
        prefix cache, adaptive drafting stays off."""
        self.exact_replies = self.exact_replies and replies
        if not drafts:
            self.drafting = None

    # -- admission ---------------------------------------------------------------------------------------
    def has_room(self, n_prompt_tokens: int, *, extra_requests: int = 0, extra_tokens: int = 0) -> bool:
        """Whether one more request of `n_prompt_tokens` fits the waiting queue's bounds (plus `extra_*`
        not yet added, e.g. the engine's inbox)."""
        return queue_has_room(
            self.config, len(self.waiting) + extra_requests, self.waiting_tokens + extra_tokens, n_prompt_tokens
        )

    def add(self, seq: Seq) -> None:
        if not seq.request.prompt_ids:
            raise ValueError("a request needs at least one prompt token")
        self.waiting.append(seq)
        self.waiting_tokens += seq.prompt_len

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    @property
    def kv_tokens_used(self) -> int:
        """Positions held by running sequences' KV."""
        return sum(s.num_computed for s in self.running)

    def find(self, request_id: str) -> Seq | None:
        seqs = itertools.chain(self.running, self.waiting)
        return next((s for s in seqs if s.request.request_id == request_id), None)

    # -- the step ----------------------------------------------------------------------------------------
    def schedule(self, now: float) -> SchedulerOutput:
        out = SchedulerOutput()
        for seq in [s for s in itertools.chain(self.running, self.waiting) if _expired(s, now)]:
            self.finish(seq, FinishReason.EXPIRED, now)
            out.expired.append(seq)
        budget = self.config.max_batch_tokens
        # An interactive prompt goes first: while one is due to prefill, batch sequences sit out the step, so the
        # arrival's first token waits for its own prefill only, not for the batch rows beside it. Never two steps
        # running, so a stream of interactive arrivals slows batch work to half its pace at worst, never stops it.
        hold = self._batch_held = not self._batch_held and self._interactive_prefill_due()
        runnable = [s for s in self.running if not (hold and s.request.priority == Priority.BATCH)]
        # decode tokens in slot order: the runner computes them in that order, so their logits need no reordering
        decoding = [s for s in sorted(runnable, key=_slot) if not s.in_prefill]
        budget -= len(decoding)
        spare = budget - (self.config.min_prefill_chunk if len(decoding) < len(runnable) or self.waiting else 0)
        # adaptive drafts only in a step that prefills nothing: a prompt's rows are worth more than a guess
        prefilling = len(decoding) < len(runnable) or (self.waiting and self.slots.n_free > 0)
        bar = self.drafting.bar(len(decoding)) if self.drafting is not None and not prefilling else 1.0
        planned: list[tuple[Seq, list[int], list[int], int]] = []  # (seq, drafts, proposal, its n-gram length)
        kept = 0.0  # adaptive drafts: the tokens they are expected to keep
        for seq in decoding:
            proposal: list[int] = []
            n = 0
            if self.config.speculative_ngram > 0:
                drafts = self._drafts(seq, spare)
            elif bar < _MAX_BAR and (room := self._draft_room(seq, spare)) >= 0:
                drafts, proposal, n, expect = self._adaptive_drafts(seq, bar, room)
                kept += expect
            else:
                drafts = []
            spare -= len(drafts)
            planned.append((seq, drafts, proposal, n))
        n_drafts = sum(len(d) for _, d, _, _ in planned)
        if self.drafting is not None and n_drafts and len(decoding) + n_drafts != self.drafting.last_rows and (
            not self.drafting.worth(len(decoding), n_drafts, kept)
        ):  # a new shape: the drafts must pay for the graph rebuilds too; their proposals are still checked
            planned = [(seq, [], proposal, n) for seq, _, proposal, n in planned]
        for seq, drafts, proposal, n in planned:
            budget -= len(drafts)
            out.chunks.append(Chunk(seq, seq.pending_ids() + drafts, seq.num_computed, True, len(drafts),
                                    tuple(proposal), n))
        for seq in runnable:
            if seq.in_prefill:
                budget -= self._add_prefill_chunk(seq, budget, out)
        while self.waiting and budget > 0:
            seq = self._next_waiting(now)
            if hold and seq.request.priority == Priority.BATCH:
                break  # only batch requests wait now (interactive ones come first): they start next step
            if budget < min(self.config.min_prefill_chunk, seq.prompt_len):
                break
            acquired = self.slots.acquire(seq.request.prompt_ids)
            if acquired is None:
                break
            self.waiting.remove(seq)
            self.waiting_tokens -= seq.prompt_len
            seq.status, seq.slot = SeqStatus.RUNNING, acquired.slot
            seq.num_computed = seq.cached_tokens = acquired.reused_tokens
            seq.request.progress.prompt_tokens = seq.request.progress.cached_tokens = acquired.reused_tokens
            seq.first_scheduled = now
            self.running.append(seq)
            out.kv_ops.extend(acquired.ops)
            budget -= self._add_prefill_chunk(seq, budget, out)
        return out

    def _interactive_prefill_due(self) -> bool:
        """An interactive prompt prefills this step (one running in prefill, or one waiting with a slot free)
        while batch sequences run beside it."""
        if not any(s.request.priority == Priority.BATCH for s in self.running):
            return False
        if any(s.in_prefill and s.request.priority != Priority.BATCH for s in self.running):
            return True
        return self.slots.n_free > 0 and any(s.request.priority != Priority.BATCH for s in self.waiting)

    def _draft_room(self, seq: Seq, spare: int) -> int:
        """How many drafts `seq` may take: -1 if it is never drafted (sampled, constrained, asking logprobs);
        else at most the step's spare budget, leaving room for the token after them within `max_new_tokens`
        (so the window holds them too), and the runner's `max_drafts`."""
        p = seq.request.params
        if not p.greedy or seq.request.constraint is not None or p.logprobs is not None:
            return -1
        room = min(spare, p.max_new_tokens - len(seq.output_ids) - 1)
        return max(0, room if self._max_drafts is None else min(room, self._max_drafts))

    def _drafts(self, seq: Seq, spare: int) -> list[int]:
        """A fixed K's prompt-lookup drafts (engine/speculative.py), within `_draft_room`."""
        k = min(self.config.speculative_ngram, self._draft_room(seq, spare))
        if k < 1:
            return []
        cfg = self.config
        return propose(seq.request.prompt_ids + seq.output_ids, k, cfg.prompt_lookup_max, cfg.prompt_lookup_min)

    def _adaptive_drafts(self, seq: Seq, bar: float, room: int) -> tuple[list[int], list[int], int, float]:
        """(drafts to feed, the whole proposal, its n-gram length, the drafts expected to be kept): the policy
        feeds the part expected to pay and learns from all of it once the step's tokens are known (`update`)."""
        policy, cfg = self.drafting, self.config
        assert policy is not None
        proposal, n = propose_n(seq.request.prompt_ids + seq.output_ids, policy.k_max, cfg.prompt_lookup_max,
                                cfg.prompt_lookup_min)
        if not proposal:
            return [], [], 0, 0.0
        k = policy.how_many(policy.sure_rate(n, seq.drafts), bar, min(room, len(proposal)))
        p = policy.rate(n, seq.drafts)
        return proposal[:k], proposal, n, sum(p ** i for i in range(1, k + 1))

    def _add_prefill_chunk(self, seq: Seq, budget: int, out: SchedulerOutput) -> int:
        remaining = seq.prompt_len - seq.num_computed
        n = min(remaining, budget)
        if remaining - n == 1:
            n -= 1  # never leave a lone last token: it would be computed as a one-token chunk
        if n <= 0 or n < min(remaining, self.config.min_prefill_chunk) or (n == 1 and seq.prompt_len > 1):
            return 0
        ids = seq.request.prompt_ids[seq.num_computed : seq.num_computed + n]
        out.chunks.append(Chunk(seq, ids, seq.num_computed, n == remaining))
        seq.request.progress.prompt_tokens = seq.num_computed + n  # committed: an abort now does not undo it
        return n

    def _next_waiting(self, now: float) -> Seq:
        running_by_tenant = Counter(s.request.tenant for s in self.running)
        aging = self.config.batch_aging_s

        def key(s: Seq) -> tuple[int, int, int, float, int]:
            req = s.request
            young = int(req.priority == Priority.BATCH and now - req.arrival < aging)
            return (int(req.priority), young, running_by_tenant[req.tenant], req.arrival, s.order)

        return min(self.waiting, key=key)

    def update(self, out: SchedulerOutput, sampled: Sequence[int], now: float) -> list[tuple[Seq, int]]:
        """Account the step: advance positions, append sampled tokens (one per chunk with logits, in order;
        a speculative chunk has `1 + n_draft`, one per position).

        Returns (seq, token) for every token kept; sequences that hit EOS or their length are finished. Of a
        speculative chunk the tokens kept are the drafts the model agreed with and the token it chose after
        them, in order, up to the first that ends the sequence; the slot's KV is valid for the first
        `num_computed` positions after (the engine truncates the rejected drafts' KV).
        """
        results: list[tuple[Seq, int]] = []
        it = iter(sampled)
        for chunk in out.chunks:
            seq = chunk.seq
            chosen = [next(it) for _ in range(1 + chunk.n_draft)] if chunk.want_logits else []
            if seq.status is not SeqStatus.RUNNING:
                continue
            if chunk.n_draft:
                chosen = chosen[: accepted(chunk.token_ids[1:], chosen) + 1]
                seq.num_computed += len(chosen)  # the fed token and the accepted drafts
            else:
                seq.num_computed += len(chunk.token_ids)
            if chunk.proposal and self.drafting is not None:
                self.drafting.observe(chunk.ngram, seq.drafts, chunk.proposal, chosen)
            for token in chosen:
                seq.output_ids.append(token)
                if seq.first_token is None:
                    seq.first_token = now
                results.append((seq, token))
                if token in self.eos_ids and not seq.request.params.ignore_eos:
                    self.finish(seq, FinishReason.EOS, now)
                elif len(seq.output_ids) >= seq.request.params.max_new_tokens:
                    self.finish(seq, FinishReason.LENGTH, now)
                if seq.status is not SeqStatus.RUNNING:
                    break
            self._record(seq)  # after the tokens: accepted drafts are computed and in `output_ids` now
        return results

    def _record(self, seq: Seq) -> None:
        """Publish the slot's newly computed tokens to the prefix cache.

        Generated tokens are published only with `exact_replies`: otherwise a decode step computes a token
        alone in its sequence's micro-batch, which rounds differently from the same token inside a prompt
        chunk, so reusing them for a prompt that repeats them (a chat's next turn) would change that request's
        output. For the same reason a one-token prompt (computed as one token) is not published.
        """
        assert seq.slot is not None
        ids = seq.request.prompt_ids
        if self.exact_replies and seq.num_computed > len(ids):
            ids = ids + seq.output_ids
        n = min(seq.num_computed, len(ids))  # (a finished sequence may have computed drafts past its last token)
        if seq.prompt_len > 1 and n > self.slots.n_cached(seq.slot):
            self.slots.record(seq.slot, ids, n)

    def finish(self, seq: Seq, reason: FinishReason, now: float) -> None:
        """Take the sequence out of the queues and free its slot at once."""
        if seq.status is SeqStatus.FINISHED:
            return
        if seq.status is SeqStatus.WAITING:
            self.waiting.remove(seq)
            self.waiting_tokens -= seq.prompt_len
        else:
            self.running.remove(seq)
            assert seq.slot is not None
            self.slots.release(seq.slot, keep_cache=reason is not FinishReason.ERROR)
        seq.status, seq.finish_reason, seq.finished_at = SeqStatus.FINISHED, reason, now


def queue_has_room(config: SchedulerConfig, n_waiting: int, waiting_tokens: int, n_prompt_tokens: int) -> bool:
    """Whether one more request fits a queue holding `n_waiting` requests of `waiting_tokens` prompt tokens."""
    return n_waiting < config.max_waiting and waiting_tokens + n_prompt_tokens <= config.max_waiting_tokens


def _slot(seq: Seq) -> int:
    return -1 if seq.slot is None else seq.slot


def _expired(seq: Seq, now: float) -> bool:
    r = seq.request
    if r.deadline is not None and now >= r.deadline:
        return True
    return r.first_token_deadline is not None and not seq.output_ids and now >= r.first_token_deadline
