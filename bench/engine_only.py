"""The concurrency workload through the engine alone: no HTTP, no client, same runner and scheduler.

    .venv/bin/python bench/engine_only.py [--streams 16] [--max-tokens 128] [--flash-attn]

`--streams` threads each submit the next of `bench/concurrency.py`'s prompts (greedy, end-of-text banned) to
an in-process `Engine` as soon as their previous request finishes. Prints tokens/s and how much of the wall
time was forward passes (`runner.execute`), so that, set beside `bench/roofline.py` (the forward passes
alone) and `bench/concurrency.py` (the same work over HTTP), it says which layer costs what.
"""

from __future__ import annotations

import argparse
import queue
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.concurrency import BANNED_EOS, CTX_PER_SLOT, n_requests, prompt
from sluicegate.backends.base import BatchItem, Logits
from sluicegate.backends.llama_cpp import LlamaCppRunner, default_model_path
from sluicegate.engine import Engine, EngineRequest, RequestOutput, SamplingParams


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
    ap.add_argument("--flash-attn", action="store_true")
    args = ap.parse_args()
    runner = TimedRunner(default_model_path(), n_ctx=CTX_PER_SLOT, n_slots=args.streams, n_threads=2,
                         flash_attn=args.flash_attn)
    engine = Engine(runner)
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
    print(f"{args.streams} streams, flash attention {'on' if args.flash_attn else 'off'}: "
          f"{n * args.max_tokens / wall:.1f} tokens/s; forward passes {runner.forward_s:.1f} s "
          f"of {wall:.1f} s wall ({100 * runner.forward_s / wall:.0f}%)")


if __name__ == "__main__":
    main()
