"""Lifecycle of one request: medians of the stage times the server reports, for 1- and 128-token requests.

    .venv/bin/python bench/lifecycle.py [--runs 20]

Requests are sent one at a time to a fresh server on the default model, so the numbers are the cost of a
single request's stages with nothing else running. Prints a markdown table.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.common import sluicegate_server
from bench.report import median

PROMPT = "Count from one to three hundred in digits, separated by commas: 1, 2, 3,"  # greedy: runs 128 tokens


def measure(url: str, new_tokens: int, runs: int) -> dict[str, float]:
    rows: dict[str, list[float]] = {k: [] for k in ("queue_ms", "prefill_ms", "decode_ms", "total_ms", "client_ms")}
    with httpx.Client(base_url=url, timeout=300) as c:
        for i in range(runs + 2):
            t = time.perf_counter()
            r = c.post("/v1/generate", json={"prompt": PROMPT, "max_new_tokens": new_tokens, "temperature": 0.0})
            wall = (time.perf_counter() - t) * 1e3
            r.raise_for_status()
            body = r.json()
            if i < 2:
                continue  # warm-up
            for k in ("queue_ms", "prefill_ms", "decode_ms", "total_ms"):
                rows[k].append(body["timing"][k])
            rows["client_ms"].append(wall)
            rows.setdefault("tokens", []).append(body["usage"]["completion_tokens"])
    return {k: median(v) for k, v in rows.items()}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=20)
    args = ap.parse_args()
    with sluicegate_server("--slots", "4") as url:
        results = {n: measure(url, n, args.runs) for n in (1, 128)}
    print("| max_new_tokens | tokens (median) | queue ms | prefill ms | decode ms | ms per decoded token "
          "| server total ms | client ms |")
    print("|---|---|---|---|---|---|---|---|")
    for n, m in results.items():
        print(f"| {n} | {m['tokens']:.0f} | {m['queue_ms']:.2f} | {m['prefill_ms']:.2f} | {m['decode_ms']:.2f} "
              f"| {m['decode_ms'] / max(m['tokens'] - 1, 1):.2f} | {m['total_ms']:.2f} | {m['client_ms']:.2f} |")


if __name__ == "__main__":
    main()
