"""Constrained against unconstrained greedy decoding through the engine alone (no HTTP), on the real model.

    .venv/bin/python bench/constrained.py [--rounds 9] [--max-tokens 128]

Three kinds of request, same prompt text, greedy, `--max-tokens` tokens each: `none` (unconstrained),
`json_object` and `json_schema` (a list of people; `minItems` keeps the grammar from ending before the
budget). All three ban end-of-text and every token with a `}` by logit_bias, so `json_object` cannot close
its object (where a schema needs a `}`, the grammar allows nothing else and the bias changes nothing).
Every request must end on length, so all kinds decode the same number of tokens, or the script fails.
Each round runs one request of each kind, alone, the first kind rotating (this machine's speed drifts
10-15% over minutes, so only requests run seconds apart compare); each request has a prompt of its own
(a unique prefix), so the prefix cache serves none of them. A constrained request's time includes
compiling its grammar, as the serving path does for every request.

Per kind: median tokens/s per request (submit to last token, prefill included) and median decode ms per
token (first to last token); the ratios are medians of each round's ratio to `none`. `full masks` counts
the steps that built the whole boolean vocabulary mask. Then the first constrained request's time to
first token with the grammar vocabulary built lazily by that request (as before the server built it at
load) and already built, interleaved.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.concurrency import BANNED_EOS, CTX_PER_SLOT
from sluicegate.backends.llama_cpp import LlamaCppRunner, default_model_path
from sluicegate.engine import Engine, EngineRequest, RequestOutput, SamplingParams
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
SCHEMAS: dict[str, dict[str, Any] | None] = {"none": None, "json_object": {"type": "object"}, "json_schema": SCHEMA}
ASK = "Describe twelve fictional people as JSON: for each a name, an age, a city and a long biography."


@dataclass
class Kind:
    name: str
    tps: list[float] = field(default_factory=list)
    decode_ms: list[float] = field(default_factory=list)
    full_masks: int = 0
    steps: int = 0


@dataclass
class Timed:
    start: float
    first: float = 0.0
    end: float = 0.0
    tokens: int = 0
    reason: str = ""
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


def run(b: Bench, schema: dict[str, Any] | None, prefix: str,
        max_tokens: int) -> tuple[Timed, constraints.GrammarConstraint | None]:
    engine, runner = b.engine, b.runner
    ids = chat_ids(runner, f"{prefix} {ASK}")
    params = SamplingParams(max_new_tokens=max_tokens, temperature=0.0, logit_bias=b.bias)
    timed = Timed(time.perf_counter())
    constraint = constraints.compile_json(runner, schema).constraint() if schema is not None else None
    engine.submit(EngineRequest(f"{prefix}-{time.monotonic_ns()}", ids, params, constraint=constraint), timed.sink)
    timed.done.wait()
    return timed, constraint


def throughput(b: Bench, rounds: int, max_tokens: int) -> list[Kind]:
    kinds = [Kind(name) for name in SCHEMAS]
    ratios: dict[str, list[tuple[float, float]]] = {k.name: [] for k in kinds[1:]}
    run(b, SCHEMA, "Warm-up.", 8)
    for r in range(rounds):
        per_token: dict[str, tuple[float, float]] = {}
        for j in range(len(kinds)):
            kind = kinds[(r + j) % len(kinds)]
            timed, c = run(b, SCHEMAS[kind.name], f"Request {r}.{j}.", max_tokens)
            if timed.tokens != max_tokens or timed.reason != "length":
                raise SystemExit(f"{kind.name}: {timed.tokens} tokens ({timed.reason}); the comparison needs "
                                 f"{max_tokens} from every request")
            kind.tps.append(max_tokens / (timed.end - timed.start))
            kind.decode_ms.append((timed.end - timed.first) * 1e3 / (max_tokens - 1))
            per_token[kind.name] = ((timed.end - timed.start) / max_tokens, kind.decode_ms[-1])
            if c is not None:
                kind.full_masks += c.full_masks
                kind.steps += max_tokens
        base = per_token["none"]
        for name, rs in ratios.items():
            rs.append((per_token[name][0] / base[0], per_token[name][1] / base[1]))
    print("\n| kind | tokens/s per request | decode ms/token | per-token cost vs none (e2e) | (decode) | full masks |")
    print("|---|---|---|---|---|---|")
    for k in kinds:
        e2e = decode = ""
        if k.name in ratios:
            e2e = f"{statistics.median(a for a, _ in ratios[k.name]):.3f}x"
            decode = f"{statistics.median(b for _, b in ratios[k.name]):.3f}x"
        masks = f"{k.full_masks}/{k.steps}" if k.steps else ""
        print(f"| {k.name} | {statistics.median(k.tps):.1f} | {statistics.median(k.decode_ms):.2f} | {e2e} | "
              f"{decode} | {masks} |")
    for name, rs in ratios.items():
        print(f"{name} per-round e2e ratios: " + ", ".join(f"{a:.3f}" for a, _ in rs))
    return kinds


def first_request(b: Bench, tries: int) -> None:
    """Time to first token of a constrained request with the vocabulary unbuilt (dropped from the cache) and built."""
    lazy: list[float] = []
    built: list[float] = []
    for i in range(tries):
        constraints._TOKENIZERS.pop(b.runner, None)  # as a fresh server before the vocabulary was built at load
        t, _ = run(b, {"type": "object"}, f"First {i}.a.", 1)
        lazy.append((t.first - t.start) * 1e3)
        t, _ = run(b, {"type": "object"}, f"First {i}.b.", 1)
        built.append((t.first - t.start) * 1e3)
    constraints._TOKENIZERS.pop(b.runner, None)
    t0 = time.perf_counter()
    constraints.tokenizer_for(b.runner)
    build = (time.perf_counter() - t0) * 1e3
    print(f"\nfirst constrained request, time to first token (median of {tries}): vocabulary built by the request "
          f"{statistics.median(lazy):.0f} ms, already built {statistics.median(built):.0f} ms; "
          f"building the vocabulary alone: {build:.0f} ms")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--first-tries", type=int, default=5)
    args = ap.parse_args()
    print(time.strftime("%Y-%m-%d %H:%M"), "loadavg", " ".join(Path("/proc/loadavg").read_text().split()[:3]),
          f"cpus {os.cpu_count()}")
    runner = LlamaCppRunner(default_model_path(), n_ctx=CTX_PER_SLOT, n_slots=2, n_threads=2)
    engine = Engine(runner)
    engine.start()
    try:
        constraints.tokenizer_for(runner)
        b = Bench(engine, runner, banned(runner))
        throughput(b, args.rounds, args.max_tokens)
        first_request(b, args.first_tries)
    finally:
        engine.stop()
        runner.close()
    print("loadavg after", " ".join(Path("/proc/loadavg").read_text().split()[:3]))


if __name__ == "__main__":
    main()
