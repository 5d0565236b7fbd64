"""A tiny deterministic numpy model with a byte-level vocabulary, for fast unit tests.

Token ids 0..255 are bytes, 256 is BOS and 257 is EOS. The "KV" of a slot is the list of token ids it has
seen; the logits of a position depend on the token, its position and a decaying summary of everything
before it, so prefix reuse, slot copies and truncation have observable effects. An EOS bias that grows
with the position makes greedy generations end by themselves.

`single_token_drift` models llama.cpp's one real numerical dependence (docs/engine.md): a token computed as
its slot's only token in a step (a decode step, a one-token prompt) rounds differently from the same token
inside a longer chunk. With it set, such a token's embedding is scaled by `1 + drift`, so a cache that
reused decoded tokens' KV for a prompt, or a scheduler that made one-token prompt chunks, changes outputs.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import numpy as np

from sluicegate.backends.base import BatchItem, LoadedModel, Logits, ModelIdentity, RunnerLimits

BOS_ID = 256
EOS_ID = 257
N_VOCAB = 258
_SPECIAL_TEXT = {BOS_ID: "<s>", EOS_ID: "</s>"}

CHAT_TEMPLATE = (  # renders tools, calls and results itself (compactly: the vocabulary is bytes)
    "{% if tools %}{{ '<|tools|>' + (tools | map(attribute='function') | map(attribute='name') | join(',')) + '\\n' }}"
    "{% endif %}"
    "{% for message in messages %}"
    "{{ '<|' + message['role'] + '|>' + message['content'] }}"
    "{% for c in message['tool_calls'] or [] %}{{ '<tool_call>' + c['function']['name'] + ' ' }}"
    "{{ c['function']['arguments'] | tojson }}{% endfor %}{{ '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>' }}{% endif %}"
)


class ReferenceRunner(LoadedModel):
    """Implements `ModelRunner` with numpy only."""

    def __init__(
        self, *, n_ctx: int = 512, n_slots: int = 8, n_batch: int = 512, seed: int = 0, dim: int = 32,
        eos_slope: float = 0.02, single_token_drift: float = 0.0, decoded_kv_exact: bool = False,
        name: str = "reference",
    ) -> None:
        """`decoded_kv_exact` declares decoded tokens' state reusable as a prompt's (llama.cpp's flash-attention
        row path); true of this model only without `single_token_drift`, which tests use to catch a cache that
        trusts a declaration the numerics do not keep."""
        rng = np.random.default_rng(seed)
        self._emb = rng.standard_normal((N_VOCAB, dim)).astype(np.float32)
        self._pos = rng.standard_normal((dim,)).astype(np.float32)
        self._out = rng.standard_normal((dim, N_VOCAB)).astype(np.float32) / np.sqrt(dim)
        self._eos_slope = eos_slope
        self._drift = single_token_drift
        self._slots: list[list[int]] = [[] for _ in range(n_slots)]
        self._alone: list[list[bool]] = [[] for _ in range(n_slots)]  # computed as its slot's only token
        self._state: list[np.ndarray] = [np.zeros(dim, np.float32) for _ in range(n_slots)]
        digest = hashlib.sha256(self._emb.tobytes() + self._out.tobytes()).hexdigest()
        self._identity = ModelIdentity(name=name, version=f"seed{seed}", digest=f"sha256:{digest}")
        self._limits = RunnerLimits(
            n_ctx=n_ctx, n_slots=n_slots, n_vocab=N_VOCAB, n_batch=n_batch,
            eos_ids=frozenset({EOS_ID}), bos_id=BOS_ID, decoded_kv_exact=decoded_kv_exact,
            drafts_exact=decoded_kv_exact, weights_bytes=self._emb.nbytes + self._out.nbytes + self._pos.nbytes,
        )
        self.executed_tokens = 0  # counters tests can read
        self.execute_calls = 0

    @property
    def chat_template(self) -> str | None:
        return CHAT_TEMPLATE

    def tokenize(self, text: str, *, add_special: bool = True, parse_special: bool = False) -> list[int]:
        ids = list(text.encode("utf-8", errors="surrogatepass"))
        return [BOS_ID, *ids] if add_special else ids

    def token_bytes(self, token_id: int) -> bytes:
        return bytes([token_id]) if 0 <= token_id < 256 else b""

    def token_text(self, token_id: int) -> str:
        if token_id in _SPECIAL_TEXT:
            return _SPECIAL_TEXT[token_id]
        return bytes([token_id]).decode("latin-1")

    def execute(self, batch: Sequence[BatchItem]) -> Logits:
        seen: set[int] = set()
        rows: list[np.ndarray] = []
        for item in batch:
            if item.slot in seen:
                raise ValueError(f"slot {item.slot} appears twice in one batch")
            seen.add(item.slot)
            held = self._slots[item.slot]
            if item.start_pos != len(held):
                raise ValueError(f"slot {item.slot} holds {len(held)} positions, batch starts at {item.start_pos}")
            state = self._state[item.slot]
            alone = len(item.token_ids) == 1
            for tok in item.token_ids:
                state = self._advance(state, int(tok), alone)
                held.append(int(tok))
                self._alone[item.slot].append(alone)
                if item.logits_all:
                    rows.append(self._logits(state, len(held)))
            self._state[item.slot] = state
            self.executed_tokens += len(item.token_ids)
            if item.want_logits and not item.logits_all:
                rows.append(self._logits(state, len(held)))
        self.execute_calls += 1
        if not rows:
            return np.zeros((0, N_VOCAB), np.float32)
        return np.stack(rows).astype(np.float32)

    def _logits(self, state: np.ndarray, n_pos: int) -> np.ndarray:
        h = np.tanh(state + self._pos * (n_pos % 17) / 17.0)
        logits: np.ndarray = (h @ self._out) * 4.0
        logits[BOS_ID] = -1e9
        logits[EOS_ID] += self._eos_slope * n_pos - 3.0
        return logits

    def _advance(self, state: np.ndarray, tok: int, alone: bool) -> np.ndarray:
        emb = self._emb[tok] * np.float32(1.0 + self._drift) if alone and self._drift else self._emb[tok]
        out: np.ndarray = 0.7 * state + emb
        return out

    def _recompute(self, slot: int) -> None:
        state = np.zeros_like(self._state[slot])
        for tok, alone in zip(self._slots[slot], self._alone[slot], strict=True):
            state = self._advance(state, tok, alone)
        self._state[slot] = state

    def clear(self, slot: int) -> None:
        self._slots[slot] = []
        self._alone[slot] = []
        self._state[slot] = np.zeros_like(self._state[slot])

    def truncate(self, slot: int, n_keep: int) -> None:
        del self._slots[slot][n_keep:]
        del self._alone[slot][n_keep:]
        self._recompute(slot)

    def copy(self, src: int, dst: int) -> None:
        self._slots[dst] = list(self._slots[src])
        self._alone[dst] = list(self._alone[src])
        self._state[dst] = self._state[src].copy()

    def clone(self, src: int, dst: int) -> None:
        self.copy(src, dst)  # copies at once already

    def save(self, slot: int, n_tokens: int) -> bytes:
        """The slot's first `n_tokens` token ids (int32) then whether each was computed alone (uint8): the state
        is a function of those, recomputed on `restore`."""
        self.truncate(slot, n_tokens)
        ids = np.asarray(self._slots[slot], dtype=np.int32).tobytes()
        return ids + np.asarray(self._alone[slot], dtype=np.uint8).tobytes()

    def restore(self, slot: int, snapshot: bytes) -> None:
        n = len(snapshot) // 5
        if len(snapshot) != 5 * n:
            raise ValueError("not a snapshot of this runner")
        self._slots[slot] = np.frombuffer(snapshot[: 4 * n], dtype=np.int32).tolist()
        self._alone[slot] = [bool(a) for a in snapshot[4 * n :]]
        self._recompute(slot)

    def close(self) -> None:
        return None
