"""What a decode step costs by where its sequences sit and which thread computes it (llama.cpp, the default model).

    flock /tmp/sluicegate-bench.lock .venv/bin/python bench/step_layout.py            # ~1 min

Two measurements, each the median of 64 decode steps of `--batch` sequences (7: a burst's admitted requests)
from position 52 (a short chat prompt), and of 16 (every slot):

- slots: the sequences in adjacent slots (0..b-1) against spread over the table (0 to 15, none adjacent):
  llama.cpp computes each run of adjacent slots as its own micro-batch, a pass over the weights each
  (engine/prefix_cache.py keeps busy slots together when it picks one);
- threads: the steps computed on the main thread, on a second thread while the main thread has never computed,
  and on a second thread after the main thread has (GNU OpenMP keeps a worker pool per computing thread; the
  engine calibrates on its own thread: engine/core.py `Engine.start`). Each case runs in a fresh process.

Prints the markdown for docs/benchmarks.md ("Step layout"); `--write` replaces that section.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "src"))
from bench.report import publish  # noqa: E402

HEADING = "## Step layout: slots and threads"
POS, STEPS = 52, 64


def _runner():  # type: ignore[no-untyped-def]
    from sluicegate.backends.llama_cpp import LlamaCppRunner, default_model_path

    return LlamaCppRunner(default_model_path(), n_slots=16, n_threads=2, adaptive_threads=False)


def _steps(r, slots: list[int]) -> float:  # type: ignore[no-untyped-def]
    """Median ms of `STEPS` decode steps of one sequence in each of `slots`."""
    from sluicegate.backends.base import BatchItem

    ids = [(100 + i) % 1000 for i in range(POS + STEPS)]
    for s in slots:
        r.clear(s)
        r.execute([BatchItem(s, ids[:POS], 0, prompt=True)])
    times = []
    for k in range(STEPS):
        began = time.perf_counter()
        r.execute([BatchItem(s, [ids[POS + k]], POS + k) for s in slots])
        times.append(time.perf_counter() - began)
    for s in slots:
        r.clear(s)
    return statistics.median(times) * 1e3


def case(name: str, batch: int) -> dict[str, float]:
    """One measurement (run in its own process: a thread pool once made is kept)."""
    r = _runner()
    adjacent = list(range(batch))
    spread = sorted({round(i * 15 / max(1, batch - 1)) for i in range(batch)})
    out: dict[str, float] = {}

    def on_thread(fn) -> None:  # type: ignore[no-untyped-def]
        t = threading.Thread(target=fn)
        t.start()
        t.join()

    if name == "slots":
        out["adjacent"], out["spread"] = _steps(r, adjacent), _steps(r, spread)
    elif name == "main":
        out["b"], out["n"] = _steps(r, adjacent), _steps(r, list(range(16)))
    elif name == "thread":
        on_thread(lambda: out.update(b=_steps(r, adjacent), n=_steps(r, list(range(16)))))
    else:  # the main thread computed first (as a calibration on another thread did), then a second thread
        _steps(r, adjacent)
        on_thread(lambda: out.update(b=_steps(r, adjacent), n=_steps(r, list(range(16)))))
    return out


def measure(name: str, batch: int) -> dict[str, float]:
    cmd = [sys.executable, __file__, "--case", name, "--batch", str(batch)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", type=int, default=7)
    ap.add_argument("--case", choices=["slots", "main", "thread", "both"], help=argparse.SUPPRESS)
    ap.add_argument("--write", action="store_true", help="replace the section in docs/benchmarks.md")
    args = ap.parse_args()
    if args.case:
        print(json.dumps(case(args.case, args.batch)))
        return
    started, load0 = time.strftime("%Y-%m-%d %H:%M"), os.getloadavg()[0]
    slots = measure("slots", args.batch)
    rows = {k: measure(k, args.batch) for k in ("main", "thread", "both")}
    b = args.batch
    text = "\n".join([
        HEADING,
        "",
        f"Command: `.venv/bin/python bench/step_layout.py` ({started}, load average {load0:.1f} at the start). "
        f"Median of {STEPS} decode steps from position {POS}, 2 compute threads, each case in a fresh process.",
        "",
        "| slots the sequences sit in | ms a step |",
        "|---|---|",
        f"| {b} adjacent (0-{b - 1}) | {slots['adjacent']:.1f} |",
        f"| {b} spread over 0-15 | {slots['spread']:.1f} |",
        "",
        f"| thread that computes | {b} sequences | 16 sequences |",
        "|---|---|---|",
        f"| the main thread | {rows['main']['b']:.1f} | {rows['main']['n']:.1f} |",
        f"| a second thread, the main thread never computed | {rows['thread']['b']:.1f} | {rows['thread']['n']:.1f} |",
        f"| a second thread after the main thread computed | {rows['both']['b']:.1f} | {rows['both']['n']:.1f} |",
        "", "",
    ])
    publish(HEADING, text, args.write)


if __name__ == "__main__":
    main()
