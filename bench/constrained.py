"""Constrained against unconstrained greedy decoding through the engine alone (no HTTP), on the real model.

    .venv/bin/python bench/constrained.py [--rounds 9] [--max-tokens 128]

Four kinds of request, same prompt text, greedy, `--max-tokens` tokens each: `none` (unconstrained),
`json_object`, `json_schema` (a list of people; `minItems` keeps the grammar from ending before the
budget), and `json_schema, whole mask`: the same with the sampler masking the whole vocabulary every step,
as it did before it checked the best token first. All of them ban end-of-text and every token with a `}`
by logit_bias, so `json_object` cannot close its object (where a schema needs a `}`, the grammar allows
nothing else and the bias changes nothing). Every request must end on length, so all kinds decode the
same number of tokens, or the script fails. Each round runs one request of each kind, alone, the first
kind rotating (this machine's speed drifts 10-15% over minutes, so only requests run seconds apart
compare); each request has a prompt of its own (a unique prefix), so the prefix cache serves none of them.
A constrained request's time includes compiling its grammar, as the serving path does for every request.

Per kind: median tokens/s per request (grammar compile, prefill and decode) and median decode ms per token
(first to last token); the ratios are medians of each round's ratio to `none`. Then where a token's time
went, in-process and so less at the mercy of other load: forward passes, the engine's sampler (masks
included), the grammar's `accept`, and compiling the grammar; `full masks` counts the steps that built the
whole boolean vocabulary mask. Then the first constrained request's time to first token on a fresh
runner, with the grammar vocabulary built by that request (as before the server built it at load) or at
load, interleaved.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.concurrency import BANNED_EOS, CTX_PER_SLOT
from sluicegate.backends.base import BatchItem, Logits
from sluicegate.backends.llama_cpp import LlamaCppRunner, default_model_path
from sluicegate.engine import Engine, EngineRequest, RequestOutput, SamplingParams
from sluicegate.engine import core as engine_core
from sluicegate.serving import constraints

PERSON = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "age": {"type": "integer"}, "city": {"type": "string"}},
    "required": ["name", "age", "city"],
    "additionalProperties": False,
}
SCHEMA = {
    "type": "object",
    "properties": {"people": {"type": "array", "items": PERSON, "minItems": 12}},
    "required": ["people"],
    "additionalProperties": False,
}
SCHEMAS: dict[str, dict[str, Any] | None] = {
    "none": None, "json_object": {"type": "object"}, "json_schema": SCHEMA, "json_schema, whole mask": SCHEMA,
}
WHOLE_MASK = {"json_schema, whole mask"}  # the sampler masks the vocabulary every step, as it did before `allows`
ASK = "Describe twelve fictional people as JSON: for each a name, an age, a city and a long biography."


class Clock:
    """Seconds spent in the forward passes, the sampler and the constraints' `accept`, summed over the run."""

    forward = 0.0
    sample = 0.0
    accept = 0.0


class TimedRunner(LlamaCppRunner):
    def execute(self, batch: Sequence[BatchItem]) -> Logits:
        t = time.perf_counter()
        try:
            return super().execute(batch)
        finally:
            Clock.forward += time.perf_counter() - t


def timed_sample(logits: Any, rows: Any) -> Any:
    t = time.perf_counter()
    try:
        return _sample(logits, rows)
    finally:
        Clock.sample += time.perf_counter() - t


_sample = engine_core.sample  # type: ignore[attr-defined]
engine_core.sample = timed_sample  # type: ignore[attr-defined]  # the engine's own name: every step is timed


class TimedConstraint:
    """Passes the engine's calls through to a grammar constraint, timing `accept` (the masks are inside `sample`)."""

    def __init__(self, inner: constraints.GrammarConstraint, whole_mask: bool) -> None:
        self.inner = inner
        self.whole_mask = whole_mask  # refuse every token: a greedy row then masks the whole vocabulary

    def allowed(self) -> Any:
        return self.inner.allowed()

    def allows(self, token_id: int) -> bool:
        return not self.whole_mask and self.inner.allows(token_id)

    def accept(self, token_id: int) -> None:
        t = time.perf_counter()
        self.inner.accept(token_id)
        Clock.accept += time.perf_counter() - t

    def is_complete(self) -> bool:
        return self.inner.is_complete()


@dataclass
class Timed:
    start: float
    first: float = 0.0
    end: float = 0.0
    compile_s: float = 0.0
    tokens: int = 0
    reason: str = ""
    clock: tuple[float, float, float] = (0.0, 0.0, 0.0)  # forward, sample, accept seconds during the request
    full_masks: int = 0
    done: threading.Event = field(default_factory=threading.Event)

    def sink(self, out: RequestOutput) -> None:
        if out.new_token_ids and not self.first:
            self.first = time.perf_counter()
        self.tokens += len(out.new_token_ids)
        if out.finished:
            self.end = time.perf_counter()
            self.reason = str(out.finish_reason)
            self.done.set()


def chat_ids(runner: LlamaCppRunner, text: str) -> list[int]:
    return runner.tokenize(f"<|im_start|>user\n{text}<|im_end|>\n<|im_start|>assistant\n", parse_special=True)


def banned(runner: LlamaCppRunner) -> dict[int, float]:
    """End-of-text and every token with a `}` (so `json_object` cannot close its object), for every kind."""
    ids = {int(k) for k in BANNED_EOS}
    ids.update(i for i in range(runner.limits.n_vocab) if b"}" in runner.token_bytes(i))
    return dict.fromkeys(sorted(ids), -100.0)


@dataclass
class Bench:
    engine: Engine
    runner: LlamaCppRunner
    bias: dict[int, float]


def run(b: Bench, schema: dict[str, Any] | None, prefix: str, max_tokens: int, whole_mask: bool = False) -> Timed:
    """One request alone; a constrained one compiles its grammar first, as the serving path does."""
    ids = chat_ids(b.runner, f"{prefix} {ASK}")
    params = SamplingParams(max_new_tokens=max_tokens, temperature=0.0, logit_bias=b.bias)
    before = (Clock.forward, Clock.sample, Clock.accept)
    timed = Timed(time.perf_counter())
    inner = constraints.compile_json(b.runner, schema).constraint() if schema is not None else None
    timed.compile_s = time.perf_counter() - timed.start
    c = TimedConstraint(inner, whole_mask) if inner is not None else None
    b.engine.submit(EngineRequest(f"{prefix}-{time.monotonic_ns()}", ids, params, constraint=c), timed.sink)
    timed.done.wait()
    after = (Clock.forward, Clock.sample, Clock.accept)
    timed.clock = (after[0] - before[0], after[1] - before[1], after[2] - before[2])
    timed.full_masks = inner.full_masks if inner is not None else 0
    return timed


def med(xs: list[float]) -> float:
    return statistics.median(xs)


def throughput(b: Bench, rounds: int, max_tokens: int) -> None:
    names = list(SCHEMAS)
    runs: dict[str, list[Timed]] = {n: [] for n in names}
    run(b, SCHEMA, "Warm-up.", 8)
    for r in range(rounds):
        for j in range(len(names)):
            name = names[(r + j) % len(names)]
            t = run(b, SCHEMAS[name], f"Request {r}.{j}.", max_tokens, whole_mask=name in WHOLE_MASK)
            if t.tokens != max_tokens or t.reason != "length":
                raise SystemExit(f"{name}: {t.tokens} tokens ({t.reason}); the comparison needs {max_tokens} "
                                 "from every request")
            runs[name].append(t)
    n = max_tokens

    def e2e(t: Timed) -> float:  # seconds per token, grammar compile and prefill included
        return (t.end - t.start) / n

    def decode(t: Timed) -> float:
        return (t.end - t.first) / (n - 1)

    print("\n| kind | tokens/s per request | decode ms/token | cost per token vs none | decode vs none "
          "| forward ms/token | sampler us/token | accept us/token | compile ms | full masks |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for name in names:
        ts = runs[name]
        ratio = dec = ""
        if name != "none":
            ratio = f"{med([e2e(t) / e2e(u) for t, u in zip(ts, runs['none'], strict=True)]):.3f}x"
            dec = f"{med([decode(t) / decode(u) for t, u in zip(ts, runs['none'], strict=True)]):.3f}x"
        masks = f"{sum(t.full_masks for t in ts)}/{n * len(ts)}" if name != "none" else ""
        accept = f"{med([t.clock[2] / n * 1e6 for t in ts]):.1f}" if name != "none" else ""
        fwd, smp = med([t.clock[0] / n * 1e3 for t in ts]), med([t.clock[1] / n * 1e6 for t in ts])
        print(f"| {name} | {med([1 / e2e(t) for t in ts]):.1f} | {med([decode(t) * 1e3 for t in ts]):.2f} | {ratio} "
              f"| {dec} | {fwd:.2f} | {smp:.0f} | {accept} | {med([t.compile_s * 1e3 for t in ts]):.2f} | {masks} |")
    for name in names[1:]:
        per_round = [e2e(t) / e2e(u) for t, u in zip(runs[name], runs["none"], strict=True)]
        print(f"{name} per-round ratios: " + ", ".join(f"{x:.3f}" for x in per_round))


def first_request(bias: dict[int, float], tries: int) -> None:
    """Time to first token of the first constrained request on a fresh runner and engine, after one
    unconstrained request (the first step of any kind has costs of its own): with the grammar vocabulary
    built by that request, as before, or at load, as `AppState.load` does now; interleaved."""
    lazy: list[float] = []
    at_load: list[float] = []
    build: list[float] = []
    for i in range(tries):
        for built in (False, True):
            runner = TimedRunner(default_model_path(), n_ctx=CTX_PER_SLOT, n_slots=2, n_threads=2)
            if built:
                t0 = time.perf_counter()
                constraints.build_vocabulary(runner)
                build.append((time.perf_counter() - t0) * 1e3)
            engine = Engine(runner)
            engine.start()
            try:
                b = Bench(engine, runner, bias)
                run(b, None, f"First {i}.{built}.", 1)
                t = run(b, {"type": "object"}, f"First {i}.{built}.", 1)
            finally:
                engine.stop()
                runner.close()
            (at_load if built else lazy).append((t.first - t.start) * 1e3)
    print(f"\nfirst constrained request, time to first token, median of {tries} fresh runners: vocabulary built by "
          f"the request {med(lazy):.0f} ms ({', '.join(f'{x:.0f}' for x in lazy)}), built at load {med(at_load):.0f} "
          f"ms ({', '.join(f'{x:.0f}' for x in at_load)}); building it at load took {med(build):.0f} ms")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--first-tries", type=int, default=5)
    args = ap.parse_args()
    print(time.strftime("%Y-%m-%d %H:%M"), "loadavg", " ".join(Path("/proc/loadavg").read_text().split()[:3]),
          f"cpus {os.cpu_count()}")
    runner = TimedRunner(default_model_path(), n_ctx=CTX_PER_SLOT, n_slots=2, n_threads=2)
    bias = banned(runner)
    constraints.build_vocabulary(runner)
    engine = Engine(runner)
    engine.start()
    try:
        throughput(Bench(engine, runner, bias), args.rounds, args.max_tokens)
    finally:
        engine.stop()
        runner.close()
    first_request(bias, args.first_tries)
    print("loadavg after", " ".join(Path("/proc/loadavg").read_text().split()[:3]))


if __name__ == "__main__":
    main()
