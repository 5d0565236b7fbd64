"""Request latency when other processes compete for the cores, side by side with llama.cpp's llama-server.

    flock /tmp/sluicegate-bench.lock .venv/bin/python bench/contention.py --write

Three servers on the same GGUF, started together and taking turns: sluicegate as it ships (its compute
threads follow the free cores, backends/cpu_threads.py), sluicegate with `--no-adaptive-threads` (llama.cpp's
threads fixed at 2, as before), and llama-server (`-t 2`). Each answers `--requests` sequential
`POST /v1/completions` of `--max-tokens` greedy tokens (end-of-text banned, so every answer is that long) while
the machine is idle, then beside one and beside two single-threaded busy loops (`python3 -c "while 1: pass"`,
unpinned: the scheduler places them as it places any neighbour). `--rounds` rounds with the first server
rotating; the table gives the median and the worst latency of every round's requests and the ratio of the
medians to the same server's idle median. A request that takes longer than `--cap` seconds is counted at the cap.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.concurrency import BANNED_EOS, model_of, ours, peer
from bench.report import write_section

KINDS = ("sluicegate", "sluicegate-fixed", "llama-server")
CONDITIONS = (0, 1, 2)  # busy neighbours


def server(kind: str, log: Path) -> contextlib.AbstractContextManager[str]:
    if kind == "llama-server":
        return peer(2, log)
    return ours(2, log, *(["--no-adaptive-threads"] if kind == "sluicegate-fixed" else []))


def one(url: str, model: str, max_tokens: int, cap: float) -> float:
    body = {"model": model, "prompt": "Write a short story about a lighthouse keeper and the sea.",
            "max_tokens": max_tokens, "temperature": 0.0, "logit_bias": BANNED_EOS}
    t = time.perf_counter()
    try:
        r = httpx.post(f"{url}/v1/completions", json=body, timeout=cap)
        r.raise_for_status()
        assert r.json()["usage"]["completion_tokens"] == max_tokens
    except httpx.TimeoutException:
        return cap
    return time.perf_counter() - t


@contextlib.contextmanager
def neighbours(n: int) -> Iterator[None]:
    procs = [subprocess.Popen([sys.executable, "-c", "while 1: pass"]) for _ in range(n)]
    try:
        time.sleep(0.5 if n else 0.0)  # let the scheduler see them before the first request
        yield
    finally:
        for p in procs:
            p.kill()
            p.wait()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=5)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--cap", type=float, default=120.0)
    ap.add_argument("--servers", default=",".join(KINDS))
    ap.add_argument("--write", action="store_true")
    args = ap.parse_args()
    kinds = args.servers.split(",")
    log = Path(tempfile.mkdtemp(prefix="sluicegate-contention-")) / "servers.log"
    lat: dict[tuple[str, int], list[float]] = {(k, c): [] for k in kinds for c in CONDITIONS}
    with contextlib.ExitStack() as stack:
        urls = {k: stack.enter_context(server(k, log)) for k in kinds}
        models = {k: model_of(u) for k, u in urls.items()}
        for k in kinds:  # warm-up: first requests pay page faults and caches
            one(urls[k], models[k], args.max_tokens, args.cap)
        for r in range(args.rounds):
            order = kinds[r % len(kinds):] + kinds[:r % len(kinds)]
            for c in CONDITIONS:
                with neighbours(c):
                    for k in order:
                        for _ in range(args.requests):
                            lat[(k, c)].append(one(urls[k], models[k], args.max_tokens, args.cap))
                        print(k, c, [round(x, 2) for x in lat[(k, c)][-args.requests:]], flush=True)
    rows = ["| server | neighbours | median s | worst s | median vs idle |", "|---|---|---|---|---|"]
    for k in kinds:
        idle = statistics.median(lat[(k, 0)])
        for c in CONDITIONS:
            xs = lat[(k, c)]
            med = statistics.median(xs)
            rows.append(f"| {k} | {c} | {med:.3f} | {max(xs):.3f} | {med / idle:.1f}x |")
    table = "\n".join(rows)
    print(table)
    if args.write:
        write_section("## CPU contention", (
            "## CPU contention\n\n"
            f"`flock /tmp/sluicegate-bench.lock .venv/bin/python bench/contention.py --write` ({args.rounds} rounds, "
            f"{args.requests} requests of {args.max_tokens} tokens per server and condition, "
            f"{time.strftime('%Y-%m-%d')}; method in the script's docstring). Busy neighbours: single-threaded "
            "`while 1: pass` loops on this 2-core machine.\n\n" + table + "\n"
        ))


if __name__ == "__main__":
    main()
