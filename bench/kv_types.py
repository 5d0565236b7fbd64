"""Flash attention's KV cache types: what bf16 keys (the runner's default) cost in speed and in quality.

    flock /tmp/sluicegate-bench.lock .venv/bin/python bench/kv_types.py [--rounds 3]

ggml's CPU flash-attention kernel leaves its one-row path (split-KV, tiled) only with an f16 or f32 K cache of
V's type; the runner keeps K in bf16 so every call takes the one-row path (backends/llama_cpp.py). Through
`LlamaCppRunner` (2 threads, pinned), for each (K, V) cache type pair, in interleaved rounds:

  speed    a lone sequence's decode step at ~100, ~300, ~600 and ~1,000 positions (median of 20 steps), a step
           of 8 sequences at ~600 positions, and a 512-token prefill in one call
  quality  logits of every position of a ~1,000-token text (two 500-token calls) against the plain kernels
           with an f32 cache (`--no-flash-attn`, the most precise arithmetic on offer): top-1 agreement, mean
           and max KL divergence

f16/f16 is llama.cpp's default (what llama-server runs): batch-dependent numerics, measured for comparison.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np

from sluicegate.backends.base import BatchItem
from sluicegate.backends.llama_cpp import LlamaCppRunner, default_model_path

PAIRS = [("bf16", "f16"), ("f16", "f16"), ("f32", "f16"), ("f16", "bf16"), ("f16", "q8_0")]


def runner(types: tuple[str, str] | None, slots: int = 8) -> LlamaCppRunner:
    """`None`: the plain kernels with an f32 cache (the quality reference)."""
    return LlamaCppRunner(default_model_path(), n_ctx=2048, n_slots=slots, n_threads=2, adaptive_threads=False,
                          flash_attn=types is not None, cache_types=types or ("f16", "f16"))


def fill(r: LlamaCppRunner, slot: int, ids: list[int]) -> None:
    r.clear(slot)
    for a in range(0, len(ids), 400):
        r.execute([BatchItem(slot, ids[a : a + 400], a, False)])


def lone_step_ms(r: LlamaCppRunner, at: int, n: int = 20) -> float:
    """The median of `n` decode steps of a lone sequence in slot 0 from position `at`, in milliseconds."""
    steps = []
    for k in range(n):
        t0 = time.perf_counter()
        r.execute([BatchItem(0, [7], at + k, True)])
        steps.append(time.perf_counter() - t0)
    return float(np.median(steps)) * 1e3


def speed(types: tuple[str, str], ids: list[int]) -> dict[str, float]:
    r = runner(types)
    try:
        out = {}
        for at in (100, 300, 600, 1000):
            fill(r, 0, ids[:at])
            out[f"lone@{at}"] = lone_step_ms(r, at)
        for s in range(8):
            fill(r, s, ids[s * 50 : s * 50 + 600])
        t0 = time.perf_counter()
        for k in range(8):
            r.execute([BatchItem(s, [7], 600 + k, True) for s in range(8)])
        out["8seq@600"] = (time.perf_counter() - t0) / 8 * 1e3
        t0 = time.perf_counter()
        for _ in range(2):
            r.clear(0)
            r.execute([BatchItem(0, ids[:512], 0, True)])
        out["prefill"] = 2 * 512 / (time.perf_counter() - t0)
        return out
    finally:
        r.close()


def logits(types: tuple[str, str] | None, ids: list[int]) -> np.ndarray:
    r = runner(types, slots=1)
    try:
        parts = [r.execute([BatchItem(0, ids[a : a + 500], a, True, logits_all=True)]).copy() for a in (0, 500)]
        return np.concatenate(parts)
    finally:
        r.close()


def log_softmax(x: np.ndarray) -> np.ndarray:
    x = x - x.max(axis=1, keepdims=True)
    out: np.ndarray = x - np.log(np.exp(x).sum(axis=1, keepdims=True))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    probe = runner(None, slots=1)
    text = (Path(__file__).resolve().parent.parent / "docs" / "engine.md").read_text(encoding="utf-8")
    ids = probe.tokenize(text)[:1000]
    probe.close()
    rng = np.random.default_rng(1)
    rand = [int(t) for t in rng.integers(100, 40_000, size=1200)]
    runs: dict[tuple[str, str], list[dict[str, float]]] = {p: [] for p in PAIRS}
    for rnd in range(args.rounds):
        for pair in PAIRS[rnd % len(PAIRS):] + PAIRS[: rnd % len(PAIRS)]:
            runs[pair].append(speed(pair, rand))
            print(f"round {rnd + 1} {pair}: " + ", ".join(f"{k} {v:.1f}" for k, v in runs[pair][-1].items()),
                  flush=True)
    ref = log_softmax(logits(None, ids))
    keys = list(runs[PAIRS[0]][0])
    print("\n| K/V cache | " + " | ".join(k if k == "prefill" else f"{k} ms" for k in keys)
          + " | top-1 agreement | mean KL | max KL |")
    print("|---" * (len(keys) + 4) + "|")
    for pair in PAIRS:
        med = {k: float(np.median([r[k] for r in runs[pair]])) for k in keys}
        got = log_softmax(logits(pair, ids))
        kl = (np.exp(ref) * (ref - got)).sum(axis=1)
        agree = float((got.argmax(axis=1) == ref.argmax(axis=1)).mean())
        cells = " | ".join(f"{med[k]:.0f} tok/s" if k == "prefill" else f"{med[k]:.1f}" for k in keys)
        print(f"| {pair[0]}/{pair[1]} | {cells} | {agree:.3f} | {kl.mean():.4f} | {kl.max():.3f} |", flush=True)


if __name__ == "__main__":
    main()
