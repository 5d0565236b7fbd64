"""Two local models in one process: a lone request's time to first token on model B while model A runs N
streams, against the same request on an idle server (issue: one busy model must not starve another's first token).

    .venv/bin/python bench/several_models.py [--model-b GGUF] [--streams 16]

One server, `--model a=GGUF_A --model b=GGUF_B` (default: the bundled SmolLM2 for both), `--slots N`. Each
round: the lone streaming chat request to B alone (idle), then N streaming requests to A (96 tokens each) and,
once they all stream, the same lone request to B. Prints the median TTFT of each over `--rounds`.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.common import sluicegate_server


def ttft(url: str, model: str, max_tokens: int, started: threading.Event | None = None) -> float:
    t = time.perf_counter()
    first = None
    with httpx.stream("POST", f"{url}/v1/chat/completions", timeout=600, json={
            "model": model, "stream": True, "max_tokens": max_tokens, "temperature": 0,
            "messages": [{"role": "user", "content": f"Tell me a story about the number {time.time_ns()}."}]}) as r:
        for line in r.iter_lines():
            if first is None and '"content":"' in line and '"content":""' not in line:
                first = time.perf_counter() - t
                if started is not None:
                    started.set()
    return first if first is not None else float("nan")


def main() -> None:
    from sluicegate.backends.llama_cpp import default_model_path

    ap = argparse.ArgumentParser()
    ap.add_argument("--model-a", default=str(default_model_path()))
    ap.add_argument("--model-b", default=str(default_model_path()))
    ap.add_argument("--streams", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    with sluicegate_server("--model", f"a={args.model_a}", "--model", f"b={args.model_b}", "--slots",
                           str(args.streams), "--ctx", "1024") as url:
        ttft(url, "a", 4), ttft(url, "b", 4)  # warm both
        idle, busy = [], []
        for _ in range(args.rounds):
            idle.append(ttft(url, "b", 8))
            events = [threading.Event() for _ in range(args.streams)]
            threads = [threading.Thread(target=ttft, args=(url, "a", 96, e)) for e in events]
            for t in threads:
                t.start()
            for e in events:
                e.wait(600)
            busy.append(ttft(url, "b", 8))
            for t in threads:
                t.join()
    print(f"| lone request to B | median TTFT (s), {args.rounds} rounds |")
    print("|---|---|")
    print(f"| server idle | {statistics.median(idle):.3f} |")
    print(f"| A running {args.streams} streams | {statistics.median(busy):.3f} |")
    print(f"\nratio: {statistics.median(busy) / statistics.median(idle):.2f}x")


if __name__ == "__main__":
    main()
