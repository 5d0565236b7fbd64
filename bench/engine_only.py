"""The concurrency workload through the engine alone: no HTTP, no client, same runner and scheduler.

    .venv/bin/python bench/engine_only.py [--streams 16] [--max-tokens 128] [--no-flash-attn] [--speculative-ngram 0]

`--streams` threads each submit the next of `bench/concurrency.py`'s prompts (greedy, end-of-text banned) to
an in-process `Engine` as soon as their previous request finishes. Prints tokens/s and how much of the wall
time was forward passes (`runner.execute`), so that, set beside `bench/roofline.py` (the forward passes
alone) and `bench/concurrency.py` (the same work over HTTP), it says which layer costs what.

Then where a step's milliseconds go, per engine step (means): wall time per step, of which the step as the
engine times it (`sluicegate_step_seconds`: scheduling, KV ops, `runner.execute`, sampling), of which
`runner.execute`, of which `llama_decode` itself (C) and the runner's Python around it (filling the batch,
the logits rows); the sampler; and what follows the step (outputs, detokenising, the loop).
To compare two versions: run it with `PYTHONPATH=<checkout>/src` for each, on a quiet machine.
"""

from __future__ import annotations

import argparse
import queue
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import llama_cpp

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import sluicegate.engine.core as engine_core
from bench.concurrency import BANNED_EOS, CTX_PER_SLOT, n_requests, prompt
from sluicegate.backends.base import BatchItem, Logits
from sluicegate.backends.llama_cpp import LlamaCppRunner, default_model_path
from sluicegate.cli.types import speculative
from sluicegate.engine import Engine, EngineRequest, RequestOutput, SamplingParams
from sluicegate.engine.scheduler import SchedulerConfig
from sluicegate.settings import load
from sluicegate.settings.convert import engine_config

SPENT = {"decode": 0.0, "sample": 0.0}


def timed(name: str, fn: Callable[..., object]) -> Callable[..., object]:
    def wrapper(*a: object, **kw: object) -> object:
        t = time.perf_counter()
        try:
            return fn(*a, **kw)
        finally:
            SPENT[name] += time.perf_counter() - t

    return wrapper


# the C call as the runner makes it, and the sampler as the engine calls it
setattr(llama_cpp, "llama_decode", timed("decode", getattr(llama_cpp, "llama_decode")))  # noqa: B009, B010
setattr(engine_core, "sample", timed("sample", getattr(engine_core, "sample")))  # noqa: B009, B010


class TimedRunner(LlamaCppRunner):
    forward_s = 0.0

    def execute(self, batch: Sequence[BatchItem]) -> Logits:
        t = time.perf_counter()
        try:
            return super().execute(batch)
        finally:
            self.forward_s += time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--streams", type=int, default=16)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--flash-attn", action=argparse.BooleanOptionalAction, default=True)
    sc = SchedulerConfig()
    ap.add_argument("--speculative-ngram", type=speculative, default="auto", help="as `serve`'s: auto, K, or 0")
    ap.add_argument("--prompt-lookup-max", type=int, default=sc.prompt_lookup_max)
    ap.add_argument("--prompt-lookup-min", type=int, default=sc.prompt_lookup_min)
    args = ap.parse_args()
    # the engine's knobs exactly as `serve` reads them
    cfg = engine_config(load({"speculative_ngram": args.speculative_ngram, "prompt_lookup_max": args.prompt_lookup_max,
                              "prompt_lookup_min": args.prompt_lookup_min}).settings)
    runner = TimedRunner(default_model_path(), n_ctx=CTX_PER_SLOT, n_slots=args.streams, n_threads=2,
                         flash_attn=args.flash_attn)
    engine = Engine(runner, cfg)
    engine.start()
    work: queue.Queue[list[int]] = queue.Queue()
    n = n_requests(args.streams)
    for i in range(n):
        work.put(runner.tokenize(prompt(i)))
    banned = {int(k): float(v) for k, v in BANNED_EOS.items()}
    params = SamplingParams(max_new_tokens=args.max_tokens, temperature=0.0, logit_bias=banned)

    def finisher(done: threading.Event) -> Callable[[RequestOutput], None]:
        return lambda out: done.set() if out.finished else None

    def client(k: int) -> None:
        while True:
            try:
                ids = work.get_nowait()
            except queue.Empty:
                return
            done = threading.Event()
            engine.submit(EngineRequest(f"c{k}-{time.monotonic_ns()}", ids, params), finisher(done))
            done.wait()

    t = time.perf_counter()
    threads = [threading.Thread(target=client, args=(k,)) for k in range(args.streams)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    wall = time.perf_counter() - t
    engine.stop()
    runner.close()
    print(f"{args.streams} streams, flash attention {'on' if args.flash_attn else 'off'}, speculative "
          f"{args.speculative_ngram}: "
          f"{n * args.max_tokens / wall:.1f} tokens/s; forward passes {runner.forward_s:.1f} s "
          f"of {wall:.1f} s wall ({100 * runner.forward_s / wall:.0f}%)")
    model = {"model_name": runner.identity.name}
    steps = engine.metrics.registry.get_sample_value("sluicegate_step_seconds_count", model) or 1.0
    step_s = engine.metrics.registry.get_sample_value("sluicegate_step_seconds_sum", model) or 0.0
    ms = {k: 1e3 * v / steps for k, v in {
        "step": step_s, "execute": runner.forward_s, "llama_decode": SPENT["decode"], "sample": SPENT["sample"],
    }.items()}
    cycle = 1e3 * wall / steps
    print(f"per step ({steps:.0f} steps), ms: {cycle:.2f} wall = step {ms['step']:.2f} [execute {ms['execute']:.2f} "
          f"(llama_decode {ms['llama_decode']:.2f} + runner Python {ms['execute'] - ms['llama_decode']:.2f}) "
          f"+ sample {ms['sample']:.2f} + scheduling and KV ops {ms['step'] - ms['execute'] - ms['sample']:.2f}] "
          f"+ outputs, detokenising and the loop {cycle - ms['step']:.2f}")


if __name__ == "__main__":
    main()
