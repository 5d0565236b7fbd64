"""A decode step of N sequences with nothing else in it, through the runner: the roof of a decode-bound workload.

    flock /tmp/sluicegate-bench.lock .venv/bin/python bench/decode_step.py [--slots 16] [--positions 100,250,400]

Every slot holds a random prompt of P tokens; then 8 steps of one token per slot (median of the last 7).
docs/benchmarks.md ("Many conversations over 16 slots") uses it to bound what a server can gain by reusing
prompts: decoding the replies alone takes at least tokens / this rate.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from sluicegate.backends.base import BatchItem
from sluicegate.backends.llama_cpp import LlamaCppRunner, default_model_path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--slots", type=int, default=16)
    ap.add_argument("--positions", default="100,250,400")
    ap.add_argument("--tiled-prefill", action="store_true")
    args = ap.parse_args()
    n = args.slots
    r = LlamaCppRunner(default_model_path(), n_ctx=1024, n_slots=n, n_threads=2, adaptive_threads=False,
                       tiled_prefill=args.tiled_prefill)
    rng = np.random.default_rng(0)
    for at in (int(p) for p in args.positions.split(",")):
        for s in range(n):
            r.clear(s)
            r.execute([BatchItem(s, [int(t) for t in rng.integers(100, 40_000, size=at)], 0, True, prompt=True)])
        times = []
        for k in range(8):
            t0 = time.perf_counter()
            r.execute([BatchItem(s, [7], at + k, True) for s in range(n)])
            times.append(time.perf_counter() - t0)
        ms = sorted(times[1:])[3] * 1e3
        print(f"{n} sequences @{at}: {ms:.1f} ms a step, {n / ms * 1e3:.0f} tokens/s", flush=True)
    r.close()


if __name__ == "__main__":
    main()
