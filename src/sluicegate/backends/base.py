"""The ModelRunner contract, designed for continuous batching.

A runner owns a fixed number of *slots*. Each slot is one sequence's KV memory (a separate KV stream in
llama.cpp, so that one sequence's numerics never depend on what else shares the step). The engine decides
which request lives in which slot; the runner only computes.

Invariants the engine relies on:
- `execute` gets at most one item per slot; an item's positions continue exactly where that slot's KV ends.
- The returned array has one row of logits per item with `want_logits=True` (one per token of an item with
  `logits_all=True`, in position order), in item order. It may be a
  view of the runner's own buffer, valid until the next `execute`: read it (or copy it) before then.
- Token bytes are exact: detokenisation is done by the engine from `token_bytes`, never by the runner.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol, cast

import numpy as np
import numpy.typing as npt

if TYPE_CHECKING:
    from sluicegate.backends.invariance import Invariance

Logits = npt.NDArray[np.float32]


@dataclass(frozen=True, slots=True)
class ModelIdentity:
    """Who answered: reported on every response."""

    name: str
    version: str
    digest: str  # "sha256:<hex>" of the weights file (or of the reference model's parameters)

    @property
    def ref(self) -> str:
        """`name@version`, the address clients may use."""
        return f"{self.name}@{self.version}"


@dataclass(frozen=True, slots=True)
class RunnerLimits:
    """What one runner can hold."""

    n_ctx: int  # positions per slot: the context window a single request sees
    n_slots: int  # sequences that can hold KV at once
    n_vocab: int
    n_batch: int  # most tokens one `execute` call may carry
    eos_ids: frozenset[int] = field(default_factory=frozenset)
    bos_id: int | None = None
    batch_invariant: bool = True  # a token's numerics do not depend on the batch around it (docs/engine.md)
    # a decoded token's KV equals what a prefill of the same token computes, so a finished reply is reusable as
    # the prompt prefix of the conversation's next turn (docs/engine.md, "Prefix cache")
    decoded_kv_exact: bool = False
    # several generated tokens verified in one item (speculative decoding) round as one-token decoding does
    drafts_exact: bool = False
    max_drafts: int | None = None  # most drafts one verification item may carry (None: the step's budget)
    numerics: str = ""  # which kernels compute (e.g. "flash-attn"): part of `system_fingerprint`
    kv_bytes_per_slot: int = 0  # one slot's KV cache at its whole window (0: not known)
    weights_bytes: int = 0  # the weights' size (the GGUF file's): with the slots' KV, what loading it costs
    sliding_window: int | None = None  # the window of the model's sliding-window layers (None: it has none)


@dataclass(frozen=True, slots=True)
class BatchItem:
    """New tokens for one slot, at positions `start_pos .. start_pos+len(token_ids)-1`."""

    slot: int
    token_ids: Sequence[int]
    start_pos: int
    want_logits: bool = True  # logits of the last token only
    logits_all: bool = False  # logits of every token of the item, in order (speculative verification)
    prompt: bool = False  # prompt tokens (prefill), not generated ones: a runner may compute the two differently


class LoadedModel:
    """What a runner reports of its model once loaded, the same way in every implementation: its `__init__`
    sets `_identity` and `_limits`, read back through the `ModelRunner` properties."""

    _identity: ModelIdentity
    _limits: RunnerLimits
    probe_at_load: bool = False  # measure at load what the limits declare exact (backends/invariance.py)
    invariance: Invariance | None = None  # what that found
    withdrawn: tuple[str, ...] = ()  # declared, and not found by the probe (batching, decoded_kv, drafts)

    def earn_invariance(self) -> Invariance:
        """Probes this runner (backends/invariance.py) and withdraws from its limits what did not hold; on the
        thread that computes (the engine's: engine/core.py `Engine.start`)."""
        from sluicegate.backends.invariance import probe

        found = probe(cast("ModelRunner", self))
        self.adopt(found)
        return found

    def adopt(self, found: Invariance) -> None:
        """What a probe of this model found (a card, the tokenizer-only runner of a model loaded when asked for,
        takes its loaded runner's finding)."""
        before, after = self._limits, found.declare(self._limits)
        self.invariance, self._limits = found, after
        self.withdrawn = tuple(name for name, was, now in (
            ("batching", before.batch_invariant, after.batch_invariant),
            ("decoded_kv", before.decoded_kv_exact, after.decoded_kv_exact),
            ("drafts", before.drafts_exact, after.drafts_exact)) if was and not now)

    @property
    def identity(self) -> ModelIdentity:
        return self._identity

    @property
    def limits(self) -> RunnerLimits:
        return self._limits


class Tokenizer(Protocol):
    """What the serving layer needs of a model: who it is, its limits, its vocabulary and its chat template, no
    compute. A runner is one; an upstream-served model has only this (its vocabulary, from a GGUF)."""

    @property
    def identity(self) -> ModelIdentity: ...

    @property
    def limits(self) -> RunnerLimits: ...

    @property
    def chat_template(self) -> str | None:
        """The model's own Jinja chat template, if it ships one."""
        ...

    def tokenize(self, text: str, *, add_special: bool = True, parse_special: bool = False) -> list[int]: ...

    def token_bytes(self, token_id: int) -> bytes:
        """The exact bytes this token contributes to the text (may be part of a UTF-8 character)."""
        ...

    def token_text(self, token_id: int) -> str:
        """The token's piece as text, special tokens rendered (for chat templates and logprobs)."""
        ...


class ModelRunner(Tokenizer, Protocol):
    """What the engine needs from a model: a `Tokenizer` that computes. Implementations: `llama_cpp`,
    `reference`."""

    def execute(self, batch: Sequence[BatchItem]) -> Logits:
        """Run one forward step over the batch; return a (n_wanted, n_vocab) float32 array."""
        ...

    def clear(self, slot: int) -> None:
        """Forget everything in `slot`."""
        ...

    def truncate(self, slot: int, n_keep: int) -> None:
        """Keep positions `0 .. n_keep-1` of `slot`, forget the rest."""
        ...

    def copy(self, src: int, dst: int) -> None:
        """Make `dst` hold exactly what `src` holds (whole stream)."""
        ...

    def clone(self, src: int, dst: int) -> None:
        """`copy`, with the data copied before it returns: a `save` or `restore` that follows it (the KV tier's
        ops in the same step) sees `dst` holding `src`'s KV and leaves `dst` alone. (llama.cpp's own copy between
        streams is only enqueued, and done at the next forward pass.)"""
        ...

    def save(self, slot: int, n_tokens: int) -> bytes:
        """A snapshot of the slot's first `n_tokens` positions, for a host-memory KV tier (engine/kv_tier.py).
        Positions from `n_tokens` on are dropped from the slot first: the engine saves a slot it is about to
        reuse for another request."""
        ...

    def restore(self, slot: int, snapshot: bytes) -> None:
        """Make `slot` hold exactly what the snapshot holds: the next `execute` on it gives bit-identical logits
        to a slot that computed those positions itself."""
        ...

    def close(self) -> None: ...
