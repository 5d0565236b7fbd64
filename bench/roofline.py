"""The most any server on llama.cpp's CPU kernels can serve of the concurrency workload on this machine.

    .venv/bin/python bench/roofline.py [--streams 16] [--max-tokens 128]

Measures, through our runner (llama.cpp, 2 threads, one KV stream per slot), what the forward passes of
`bench/concurrency.py`'s workload cost when nothing else runs: each prompt's prefill (ms per prompt token),
and a decode step of `--streams` sequences at the workload's mean context (ms per generated token); with
flash attention off and on (as we ship it, kept on its one-row path; llama-server's default). The roof is then
generated tokens / (prefill time of every prompt + decode time of every generated token):
no scheduler, no HTTP, no sampling, and no closed-loop tail where fewer streams run, so a real server stays
below it. Prints a markdown table.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.concurrency import CTX_PER_SLOT, n_requests, prompt
from sluicegate.backends.base import BatchItem
from sluicegate.backends.llama_cpp import LlamaCppRunner, default_model_path


def measure(flash_attn: bool, prompts: list[list[int]], streams: int, max_tokens: int) -> tuple[float, float]:
    """(ms per prompt token, ms per generated token in a step of `streams` sequences)."""
    runner = LlamaCppRunner(default_model_path(), n_ctx=CTX_PER_SLOT, n_slots=streams, n_threads=2,
                            flash_attn=flash_attn)
    try:
        per_token = []
        for rep, ids in enumerate(prompts[: 2 * streams]):
            slot = rep % streams
            runner.clear(slot)
            t = time.perf_counter()
            runner.execute([BatchItem(slot, ids, 0, True)])
            if rep:  # the first pass warms up
                per_token.append((time.perf_counter() - t) * 1e3 / len(ids))
        ctx = round(statistics.mean(len(p) for p in prompts) + max_tokens / 2)
        for slot in range(streams):
            runner.clear(slot)
            runner.execute([BatchItem(slot, [(7 * i + slot) % 1000 + 100 for i in range(ctx)], 0, False)])
        steps = []
        for step in range(12):
            batch = [BatchItem(slot, [200 + step], ctx + step, True) for slot in range(streams)]
            t = time.perf_counter()
            runner.execute(batch)
            steps.append((time.perf_counter() - t) * 1e3 / streams)
        return statistics.median(per_token), statistics.median(steps[2:])
    finally:
        runner.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--streams", type=int, default=16)
    ap.add_argument("--max-tokens", type=int, default=128)
    args = ap.parse_args()
    n = n_requests(args.streams)
    tok = LlamaCppRunner(default_model_path(), n_ctx=CTX_PER_SLOT, n_slots=1)
    prompts = [tok.tokenize(prompt(i)) for i in range(n)]
    tok.close()
    total_prompt = sum(len(p) for p in prompts)
    total_gen = n * args.max_tokens
    print(f"{n} requests: {total_prompt} prompt tokens (mean {total_prompt / n:.0f}), "
          f"{total_gen} generated\n")
    print(f"| flash attention | prefill ms/token | decode ms/token ({args.streams} streams) | roof tokens/s |")
    print("|---|---|---|---|")
    for fa in (False, True):
        prefill, decode = measure(fa, prompts, args.streams, args.max_tokens)
        roof = total_gen / ((total_prompt * prefill + total_gen * decode) / 1e3)
        print(f"| {'on' if fa else 'off'} | {prefill:.2f} | {decode:.2f} | {roof:.0f} |", flush=True)


if __name__ == "__main__":
    main()
