"""Grammar-constrained decoding: JSON schema (response_format, tool arguments) through llguidance.

Why llguidance and not llama.cpp's grammar sampler: it is maintained (Microsoft; llama.cpp, vLLM and SGLang
ship it as their structured-output backend), compiles JSON Schema itself (no GBNF translation of ours), has
manylinux wheels with no dependencies, and works on any vocabulary given the tokens' bytes, so the same
constraint runs on the llama.cpp backend and on the byte-level reference backend used in tests. It fits the
engine's `Constraint` protocol: a boolean mask per step, and a one-token check.

Cost (SmolLM2, 49k tokens; docs/benchmarks.md "Constrained decoding"): the vocabulary (`LLTokenizer`) takes
0.2-0.3 s to build, once per runner, at model load (`build_vocabulary`), not in the first constrained
request; compiling a JSON schema is ~1 ms per request; a step's mask is computed into a preallocated packed
buffer, 0.1-0.2 ms in the engine against a 8-10 ms forward pass. A greedy row checks its best token against
that buffer and unpacks and applies the whole mask (~50 us of numpy) only when the grammar refuses the
token. llguidance's own one-token check (`validate_tokens`) is cheaper still but accepts tokens the mask
refuses (measured), so it is not used. Computing the next mask on another thread during the forward pass was
measured slower on two cores (the forward pass lost 0.2 ms per step to a 0.06 ms mask computation).

The JSON is compact with one space after `,` and `:` (`whitespace_flexible` off): a small model given free
whitespace can spend its whole budget on newlines. Schemas that use a keyword llguidance cannot enforce are
refused (400), not loosened.

The mask is never empty: if the matcher fails (it should not: every token the engine accepts was allowed),
only end-of-sequence is allowed, so the request ends instead of failing the batch it shares a step with.
"""

from __future__ import annotations

import json
import logging
import threading
import weakref
from typing import Any

import llguidance as llg
import numpy as np
import numpy.typing as npt

from sluicegate.backends.base import Tokenizer

log = logging.getLogger("sluicegate.constraints")

JSON_OPTIONS: dict[str, Any] = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
_LIMITS = llg.LLParserLimits(verbose_errors=False)


class GrammarError(Exception):
    """The schema cannot be compiled to a grammar (invalid, or uses what llguidance cannot enforce)."""


class GrammarConstraint:
    """One sequence's grammar state; implements `sluicegate.engine.types.Constraint` (engine thread only).

    The state's mask is computed once per step into a preallocated packed buffer (llguidance's layout: bit
    `i % 32` of 32-bit word `i // 32`, little-endian). `allows` reads one bit of it, so a greedy row whose
    best token the grammar allows never unpacks the mask into a vocabulary-sized boolean array; `allowed`
    unpacks it for the rows that need the whole mask (sampling, logprobs, a best token the grammar refuses).
    """

    def __init__(self, matcher: llg.LLMatcher, n_vocab: int, eos_ids: frozenset[int],
                 schema: dict[str, Any] | None = None) -> None:
        self.schema = schema  # the JSON schema enforced, when it came from one (sent on to an upstream engine)
        self._matcher = matcher
        self._n_vocab = n_vocab
        self._bits = np.zeros((n_vocab + 31) // 32, dtype=np.uint32)
        self._fresh = False  # `_bits` holds the mask of the current state
        self._empty = False  # ... and it allows no token
        self._eos_only = np.zeros(n_vocab, dtype=bool)
        self._eos_only[sorted(eos_ids)] = True
        self.failed: str | None = None
        self.refusal_param = "response_format"  # what an upstream engine that cannot take it refuses by name
        self.full_masks = 0  # steps that unpacked the whole mask (bench/constrained.py reports it)

    def _mask_bits(self) -> npt.NDArray[np.uint32] | None:
        """The packed mask of the current state, computed at most once per step; None if nothing is allowed."""
        if not self._fresh:
            if self._matcher.is_error():
                return None
            self._matcher.unsafe_compute_mask_ptr(self._bits.ctypes.data, self._bits.nbytes)  # drops the GIL
            self._fresh = True
            self._empty = not self._bits.any()
        return None if self._empty else self._bits

    def allows(self, token_id: int) -> bool:
        bits = self._mask_bits()
        return bits is not None and bool((int(bits[token_id >> 5]) >> (token_id & 31)) & 1)

    def allowed(self) -> npt.NDArray[np.bool_] | None:
        bits = self._mask_bits()
        if bits is None:
            self._fail(self._matcher.get_error() or "the grammar allows no token")
            return self._eos_only
        self.full_masks += 1
        return np.unpackbits(bits.view(np.uint8), count=self._n_vocab, bitorder="little").view(np.bool_)

    def accept(self, token_id: int) -> None:
        self._fresh = False
        if not self._matcher.is_error() and not self._matcher.consume_token(token_id):
            self._fail(self._matcher.get_error())

    def is_complete(self) -> bool:
        return self._matcher.is_accepting()

    def _fail(self, why: str) -> None:
        if self.failed is None:
            self.failed = why
            log.error("grammar matcher failed: %s", why)


class Grammar:
    """A compiled grammar for one model; `constraint()` gives each sequence its own state."""

    refusal_param = "response_format"

    def __init__(self, runner: Tokenizer, grammar: str, schema: dict[str, Any] | None = None) -> None:
        self.schema = schema
        matcher = llg.LLMatcher(tokenizer_for(runner), grammar, log_level=0, limits=_LIMITS)
        if matcher.is_error():
            raise GrammarError(matcher.get_error())
        self._matcher = matcher
        self._n_vocab = runner.limits.n_vocab
        self._eos_ids = runner.limits.eos_ids

    def constraint(self) -> GrammarConstraint:
        c = GrammarConstraint(self._matcher.deep_copy(), self._n_vocab, self._eos_ids, self.schema)
        c.refusal_param = self.refusal_param
        return c


def json_schema_grammar(schema: dict[str, Any]) -> str:
    """The llguidance grammar for JSON text that validates against `schema` (blocking: call off the loop)."""
    try:
        return str(llg.LLMatcher.grammar_from_json_schema(json.dumps(schema), overrides=JSON_OPTIONS))  # type: ignore[arg-type]
    except (ValueError, TypeError) as exc:
        raise GrammarError(str(exc)) from None


def compile_json(runner: Tokenizer, schema: dict[str, Any]) -> Grammar:
    """Compile `schema` for `runner` (blocking: grammar construction, and the vocabulary if not yet built)."""
    return Grammar(runner, json_schema_grammar(schema), schema)


class _Vocab:
    """What llguidance's TokenizerWrapper needs, read from a Tokenizer."""

    def __init__(self, runner: Tokenizer) -> None:
        limits = runner.limits
        tokens: list[bytes] = []
        special: list[int] = []
        for i in range(limits.n_vocab):
            piece = runner.token_bytes(i)
            if not piece:  # control tokens have no text bytes: llguidance marks them with a 0xff prefix
                piece = b"\xff" + runner.token_text(i).encode("utf-8", errors="replace")
                special.append(i)
            tokens.append(piece)
        self.tokens = tokens
        self.special_token_ids = special
        self.eos_token_id = min(limits.eos_ids) if limits.eos_ids else None
        self.bos_token_id = limits.bos_id
        self._runner = runner

    def __call__(self, text: str) -> list[int]:
        if not isinstance(text, str):
            raise TypeError("text only")
        return self._runner.tokenize(text, add_special=False, parse_special=False)


_TOKENIZERS: weakref.WeakKeyDictionary[Tokenizer, llg.LLTokenizer] = weakref.WeakKeyDictionary()
_LOCK = threading.Lock()


def build_vocabulary(runner: Tokenizer) -> None:
    """Build the runner's grammar vocabulary now (blocking), so that no constrained request waits for it."""
    tokenizer_for(runner)


def tokenizer_for(runner: Tokenizer) -> llg.LLTokenizer:
    """The runner's llguidance tokenizer, built once (~0.4 s for a 49k vocabulary)."""
    with _LOCK:
        tok = _TOKENIZERS.get(runner)
        if tok is None:
            vocab = _Vocab(runner)
            tok = llg.LLTokenizer(
                llg.TokenizerWrapper(vocab),
                n_vocab=runner.limits.n_vocab,
                eos_token=sorted(runner.limits.eos_ids),
            )
            _TOKENIZERS[runner] = tok
        return tok
