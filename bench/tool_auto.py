"""The cost of `tool_choice: "auto"` against free text, per token, through the engine alone, on the real model.

    .venv/bin/python bench/tool_auto.py [--rounds 9] [--max-tokens 128]

Two kinds of request, same prompt (a question plus the tool list and the `auto` instruction, as the chat
adapter renders them), greedy, `--max-tokens` tokens each, end-of-text banned by logit_bias so both decode the
same number of tokens: `free` (no constraint: what `tool_choice: "none"` costs) and `auto` (the lazy grammar
of serving/tool_calls.py: free text until a `<tool_call>` trigger; the model writes none here, so this is the
price `auto` adds to every answer that is text). Every request must end on length, or the script fails. Each
round runs one of each, alone, the first kind alternating (this machine's speed drifts over minutes, so only
requests run seconds apart compare); each request has a prompt of its own, so the prefix cache serves none.
An `auto` request's time includes compiling its grammar, as the serving path does for every request.

Per kind: median tokens/s per request (compile, prefill and decode), median decode ms per token; the ratios
are medians of each round's ratio to `free`; then the sampler's and the grammar's `accept` time per token.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.concurrency import BANNED_EOS, CTX_PER_SLOT
from bench.constrained import Clock, Timed, TimedConstraint, TimedRunner, chat_ids
from sluicegate.backends.llama_cpp import default_model_path
from sluicegate.engine import Engine, EngineRequest, SamplingParams
from sluicegate.serving import constraints
from sluicegate.serving.tool_calls import ToolSpec, compile_auto, instructions

WEATHER = {"type": "object", "properties": {"city": {"type": "string"}, "unit": {"enum": ["celsius", "fahrenheit"]}},
           "required": ["city", "unit"], "additionalProperties": False}
TOOLS = [ToolSpec("get_weather", "Current weather in a city", WEATHER),
         ToolSpec("get_time", "The time in a time zone", {"type": "object", "properties": {"tz": {"type": "string"}}})]
ASK = "Tell me a long story about a lighthouse keeper and the sea."


def run(engine: Engine, runner: TimedRunner, auto: bool, prefix: str, max_tokens: int) -> Timed:
    text = f"{prefix} {ASK}\n\n" + instructions(TOOLS, "auto", None, listed=False, template_syntax=False)
    ids = chat_ids(runner, text)
    params = SamplingParams(max_new_tokens=max_tokens, temperature=0.0,
                            logit_bias={int(k): v for k, v in BANNED_EOS.items()})
    before = (Clock.forward, Clock.sample, Clock.accept)
    timed = Timed(time.perf_counter())
    c = TimedConstraint(compile_auto(runner, TOOLS, True).constraint(), False) if auto else None
    timed.compile_s = time.perf_counter() - timed.start
    engine.submit(EngineRequest(f"{prefix}-{time.monotonic_ns()}", ids, params, constraint=c), timed.sink)
    timed.done.wait()
    after = (Clock.forward, Clock.sample, Clock.accept)
    timed.clock = (after[0] - before[0], after[1] - before[1], after[2] - before[2])
    return timed


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--max-tokens", type=int, default=128)
    args = ap.parse_args()
    print(time.strftime("%Y-%m-%d %H:%M"), "loadavg", " ".join(Path("/proc/loadavg").read_text().split()[:3]),
          f"cpus {os.cpu_count()}")
    runner = TimedRunner(default_model_path(), n_ctx=CTX_PER_SLOT, n_slots=2, n_threads=2)
    constraints.build_vocabulary(runner)
    engine = Engine(runner)
    engine.start()
    n: int = args.max_tokens
    runs: dict[str, list[Timed]] = {"free": [], "auto": []}
    try:
        run(engine, runner, True, "Warm-up.", 8)
        for r in range(args.rounds):
            for j, name in enumerate(["free", "auto"] if r % 2 == 0 else ["auto", "free"]):
                t = run(engine, runner, name == "auto", f"Request {r}.{j}.", n)
                if t.tokens != n or t.reason != "length":
                    raise SystemExit(f"{name}: {t.tokens} tokens ({t.reason}); the comparison needs {n}")
                runs[name].append(t)
    finally:
        engine.stop()
        runner.close()
    med = statistics.median

    def e2e(t: Timed) -> float:
        return float(t.end - t.start) / n

    def decode(t: Timed) -> float:
        return float(t.end - t.first) / (n - 1)

    print("\n| kind | tokens/s per request | decode ms/token | cost per token vs free | decode vs free "
          "| sampler us/token | accept us/token | compile ms |")
    print("|---|---|---|---|---|---|---|---|")
    for name, ts in runs.items():
        ratio = dec = accept = ""
        if name == "auto":
            ratio = f"{med([e2e(t) / e2e(u) for t, u in zip(ts, runs['free'], strict=True)]):.3f}x"
            dec = f"{med([decode(t) / decode(u) for t, u in zip(ts, runs['free'], strict=True)]):.3f}x"
            accept = f"{med([t.clock[2] / n * 1e6 for t in ts]):.1f}"
        print(f"| {name} | {med([1 / e2e(t) for t in ts]):.1f} | {med([decode(t) * 1e3 for t in ts]):.2f} | {ratio} "
              f"| {dec} | {med([t.clock[1] / n * 1e6 for t in ts]):.0f} | {accept} "
              f"| {med([t.compile_s * 1e3 for t in ts]):.2f} |")
    print("auto per-round ratios: " + ", ".join(
        f"{e2e(t) / e2e(u):.3f}" for t, u in zip(runs["auto"], runs["free"], strict=True)))


if __name__ == "__main__":
    main()
