"""Prefill and decoding against the prompt's length, for the three attention set-ups a user can meet.

    flock /tmp/sluicegate-bench.lock .venv/bin/python bench/prefill.py [--rounds 3]

Through `LlamaCppRunner` (2 threads, pinned, one slot), in interleaved rounds:

  shipped      flash attention with bf16 keys: every call on the kernel's one-row path, so a position's KV is the
               same whether it was computed in a prompt chunk or as a generated token (replies reused)
  plain        `--no-flash-attn`: the plain kernels (exact whatever the batch; replies recomputed)
  llama.cpp    flash attention with f16/f16, llama.cpp's default and llama-server's: the tiled kernel for calls
               of many rows, so its results depend on how a prompt is split (not offered by the server)
  tiled        `--tiled-prefill`: f16/f16 with every prompt piece on the tiled kernel and every generated token
               on the one-row path (a lone decode step from 192 positions carries a twin row in slot 1)

For each prompt length L: the prompt in calls of at most 512 tokens, as the engine's steps carry it (prompt
tokens per second, median of 3), then a lone sequence's decode step at position L (median of 10 steps).
"A long shared system prompt" in docs/benchmarks.md asked how the one-row path's cost grows with the context.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.kv_types import lone_step_ms
from sluicegate.backends.base import BatchItem
from sluicegate.backends.llama_cpp import LlamaCppRunner, default_model_path

SETUPS = {"shipped": (True, ("bf16", "f16")), "plain": (False, ("f16", "f16")), "llama.cpp": (True, ("f16", "f16")),
          "tiled": (True, ("f16", "f16"))}
LENGTHS = (64, 128, 256, 512, 1024)


def measure(name: str, ids: list[int]) -> dict[str, float]:
    flash, types = SETUPS[name]
    # two slots: a lone decode step's twin row needs a neighbour to host it (backends/tiled.py)
    r = LlamaCppRunner(default_model_path(), n_ctx=2048, n_slots=2, n_threads=2, adaptive_threads=False,
                       flash_attn=flash, cache_types=types, tiled_prefill=name == "tiled")
    try:
        out: dict[str, float] = {}
        for n in LENGTHS:
            times = []
            for _ in range(3):
                r.clear(0)
                t0 = time.perf_counter()
                for a in range(0, n, 512):
                    r.execute([BatchItem(0, ids[a : min(n, a + 512)], a, a + 512 >= n, prompt=True)])
                times.append(time.perf_counter() - t0)
            out[f"prefill@{n}"] = n / float(np.median(times))
            out[f"step@{n}"] = lone_step_ms(r, n, 10)
        return out
    finally:
        r.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    ids = [int(t) for t in np.random.default_rng(1).integers(100, 40_000, size=max(LENGTHS))]
    names = list(SETUPS)
    runs: dict[str, list[dict[str, float]]] = {k: [] for k in names}
    for rnd in range(args.rounds):
        for name in names[rnd % len(names):] + names[: rnd % len(names)]:
            runs[name].append(measure(name, ids))
            print(f"round {rnd + 1} {name}: " + ", ".join(f"{k} {v:.1f}" for k, v in runs[name][-1].items()),
                  flush=True)
    print("\n| set-up | " + " | ".join(f"prefill {n} tok/s" for n in LENGTHS) + " | "
          + " | ".join(f"step @{n} ms" for n in LENGTHS) + " |")
    print("|---" * (2 * len(LENGTHS) + 1) + "|")
    for name in names:
        med = {k: float(np.median([r[k] for r in runs[name]])) for k in runs[name][0]}
        print(f"| {name} | " + " | ".join(f"{med[f'prefill@{n}']:.0f}" for n in LENGTHS) + " | "
              + " | ".join(f"{med[f'step@{n}']:.1f}" for n in LENGTHS) + " |")


if __name__ == "__main__":
    main()
