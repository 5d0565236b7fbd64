"""What an idle server costs the machine: CPU per second of each of its threads, with no request in flight.

    flock /tmp/sluicegate-bench.lock .venv/bin/python bench/idle.py [--seconds 20] [--rounds 3]
    SLUICEGATE_BEFORE_SRC=/tmp/wt-old/src ... bench/idle.py --servers sluicegate,sluicegate-before,llama-server

Every server is started at once (the default model, 1 slot) and left idle; after a settling pause, each
round reads every thread's CPU time from /proc (the server and its children) over `--seconds` of wall time,
one server at a time. An idle server's CPU is taken from llama.cpp's compute threads the moment a request
comes (they wait on each other at every barrier: docs/benchmarks.md, "CPU contention") and from every other
process on the machine.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.concurrency import PIDS, server
from bench.report import median


def tree(pid: int) -> list[int]:
    """`pid` and its descendants (llama-cpp-server is a wrapper around the real server)."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        with contextlib.suppress(OSError):
            for t in os.listdir(f"/proc/{p}/task"):
                with contextlib.suppress(OSError):
                    todo += [int(c) for c in Path(f"/proc/{p}/task/{t}/children").read_text().split()]
    return out


def cpu_s(pids: list[int]) -> float:
    """User + system CPU seconds of every thread of `pids` so far."""
    total = 0
    for pid in pids:
        with contextlib.suppress(OSError):
            for t in os.listdir(f"/proc/{pid}/task"):
                with contextlib.suppress(OSError):
                    fields = Path(f"/proc/{pid}/task/{t}/stat").read_text().rpartition(")")[2].split()
                    total += int(fields[11]) + int(fields[12])
    return total / os.sysconf("SC_CLK_TCK")


def server_pid(url: str) -> int:
    if url in PIDS:
        return PIDS[url]
    port = url.rpartition(":")[2]
    for p in os.listdir("/proc"):  # the peer: found by its port on its command line
        with contextlib.suppress(OSError):
            if p.isdigit() and f"--port\0{port}\0" in Path(f"/proc/{p}/cmdline").read_text():
                return int(p)
    raise RuntimeError(f"no process serves {url}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--servers", default="sluicegate,llama-server")
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--log", type=Path, default=Path("bench/results/idle.log"))
    args = ap.parse_args()
    args.log.parent.mkdir(parents=True, exist_ok=True)
    kinds = args.servers.split(",")
    per: dict[str, list[float]] = {k: [] for k in kinds}
    with contextlib.ExitStack() as stack:
        pids = {k: server_pid(stack.enter_context(server(k, 1, args.log))) for k in kinds}
        time.sleep(5)  # start-up work (migrations, the first polls) settles
        for r in range(args.rounds):
            for kind in kinds[r % len(kinds):] + kinds[: r % len(kinds)]:
                procs = tree(pids[kind])
                c0, t0 = cpu_s(procs), time.monotonic()
                time.sleep(args.seconds)
                per[kind].append((cpu_s(procs) - c0) / (time.monotonic() - t0) * 1e3)
                print(f"{kind} round {r + 1}: {per[kind][-1]:.1f} ms CPU per second", flush=True)
    print("\n| server | CPU ms per second idle (median) | rounds |\n|---|---|---|")
    for kind in kinds:
        print(f"| {kind} | {median(per[kind]):.1f} | {', '.join(f'{x:.1f}' for x in per[kind])} |")


if __name__ == "__main__":
    main()
