"""Grammar constraints (llguidance) on the reference backend: the packed mask, the one-token check, the engine's
greedy shortcut against masking every step, and the vocabulary built at model load."""

from __future__ import annotations

import threading
from typing import Any

import llguidance as llg
import numpy as np
import numpy.typing as npt
import pytest

from sluicegate.backends.reference import EOS_ID, ReferenceRunner
from sluicegate.engine import Engine, EngineRequest, RequestOutput, SamplingParams
from sluicegate.serving import constraints
from sluicegate.serving.constraints import GrammarConstraint, compile_json
from tests.conftest import make_client, wait_ready

SCHEMAS: list[dict[str, Any]] = [
    {"type": "object"},
    {
        "type": "object",
        "properties": {
            "ok": {"type": "boolean"},
            "n": {"type": "integer", "minimum": 0, "maximum": 99},
            "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 3},
        },
        "required": ["ok", "n", "tags"],
        "additionalProperties": False,
    },
    {"anyOf": [{"type": "object", "properties": {"name": {"const": "clock"}}, "required": ["name"]},
               {"type": "array", "items": {"enum": ["red", "green", "blue"]}, "minItems": 2}]},
]
PROMPTS = ["Answer in JSON: ", "Some JSON, please. ", "{"]


class Collector:
    def __init__(self) -> None:
        self.tokens: list[int] = []
        self.done = threading.Event()
        self.reason = ""

    def __call__(self, out: RequestOutput) -> None:
        self.tokens.extend(out.new_token_ids)
        if out.finished:
            self.reason = str(out.finish_reason)
            self.done.set()


class WholeMask:
    """Wraps a constraint so that the sampler masks the vocabulary at every step, as it did before `allows`:
    refusing every token sends a greedy row to the whole mask, whose best token is the answer."""

    def __init__(self, inner: GrammarConstraint) -> None:
        self.inner = inner

    def allowed(self) -> npt.NDArray[np.bool_] | None:
        return self.inner.allowed()

    def allows(self, token_id: int) -> bool:
        return False

    def accept(self, token_id: int) -> None:
        self.inner.accept(token_id)

    def is_complete(self) -> bool:
        return self.inner.is_complete()


@pytest.mark.parametrize("schema", SCHEMAS)
def test_one_token_answers_as_the_mask_and_the_mask_as_llguidance(schema: dict[str, Any]) -> None:
    runner = ReferenceRunner()
    grammar = compile_json(runner, schema)
    c, reference = grammar.constraint(), grammar.constraint()
    matcher: llg.LLMatcher = reference._matcher
    rng = np.random.default_rng(0)
    for _ in range(60):
        if matcher.is_stopped():
            break
        bits = np.frombuffer(matcher.compute_bitmask(), dtype=np.uint8)
        expected = np.unpackbits(bits, bitorder="little")[: runner.limits.n_vocab].astype(bool)
        assert [c.allows(t) for t in range(runner.limits.n_vocab)] == expected.tolist()
        mask = c.allowed()
        assert mask is not None and (mask == expected).all()
        allowed = [int(t) for t in np.flatnonzero(expected) if t != EOS_ID]
        if not allowed:
            break
        token = int(rng.choice(allowed))
        c.accept(token)
        assert matcher.consume_token(token)
    assert c.failed is None


def test_a_failed_matcher_allows_only_end_of_sequence() -> None:
    runner = ReferenceRunner()
    c = compile_json(runner, {"type": "object"}).constraint()
    c.accept(ord("x"))  # not JSON: the matcher fails
    assert c.failed and not c.allows(ord("{"))
    mask = c.allowed()
    assert mask is not None and np.flatnonzero(mask).tolist() == [EOS_ID]


def test_greedy_constrained_output_is_the_same_as_masking_every_step() -> None:
    runner = ReferenceRunner(n_slots=8, eos_slope=0.0)
    engine = Engine(runner)
    engine.start()
    try:
        pairs: list[tuple[Collector, Collector, GrammarConstraint]] = []
        for schema in SCHEMAS:
            grammar = compile_json(runner, schema)
            for text in PROMPTS:
                ids = runner.tokenize(text)
                fast, whole = grammar.constraint(), grammar.constraint()
                a, b = Collector(), Collector()
                params = SamplingParams(max_new_tokens=60, temperature=0.0)
                engine.submit(EngineRequest(f"fast-{len(pairs)}", ids, params, constraint=fast), a)
                engine.submit(EngineRequest(f"whole-{len(pairs)}", ids, params, constraint=WholeMask(whole)), b)
                pairs.append((a, b, fast))
        for a, b, fast in pairs:
            assert a.done.wait(30) and b.done.wait(30)
            assert a.tokens == b.tokens and a.reason == b.reason
            assert fast.failed is None
        steps = sum(len(a.tokens) for a, _, _ in pairs)
        assert sum(fast.full_masks for _, _, fast in pairs) < steps  # the shortcut was taken
    finally:
        engine.stop()


def test_the_vocabulary_is_built_at_load_not_by_the_first_request(monkeypatch: pytest.MonkeyPatch) -> None:
    built: list[object] = []

    class Counting(constraints._Vocab):
        def __init__(self, runner: Any) -> None:
            built.append(runner)
            super().__init__(runner)

    monkeypatch.setattr(constraints, "_Vocab", Counting)
    with make_client() as client:
        wait_ready(client)
        runner = client.app.state.sluicegate.runtime.model.runner  # type: ignore[attr-defined]
        assert built == [runner] and runner in constraints._TOKENIZERS
        body = {"model": "reference", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8, "seed": 1,
                "response_format": {"type": "json_object"}}
        assert client.post("/v1/chat/completions", json=body).status_code == 200
        assert built == [runner]
