"""How often does batching change a greedy or seeded output? In-process, flash attention on vs off.

    flock /tmp/sluicegate-bench.lock .venv/bin/python bench/fidelity.py [--new-tokens 64]
    ... bench/fidelity.py --model gemma-3-270m-q4_k_m.gguf --shipped-only   # another model, as served

Runs the 32 requests of tests/e2e/test_batching.py through the engine (LlamaCppRunner, 16 slots) one at a
time and then all at once, with llama.cpp's flash attention on (as the runner ships it: every call on the
kernel's one-row path) and off, and counts the requests whose token ids differ, with the first differing
position. docs/engine.md quotes the result.
"""

from __future__ import annotations

import argparse
import sys
import threading
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tests.e2e.test_batching import bodies

from sluicegate.backends.llama_cpp import LlamaCppRunner, default_model_path
from sluicegate.engine import Engine, EngineRequest, RequestOutput, SamplingParams


def run(engine: Engine, requests: list[EngineRequest]) -> list[list[int]]:
    outs: dict[str, list[int]] = {r.request_id: [] for r in requests}
    left = threading.Semaphore(0)

    def sink(o: RequestOutput) -> None:
        outs[o.request_id].extend(o.new_token_ids)
        if o.finished:
            left.release()

    for r in requests:
        engine.submit(r, sink)
    for _ in requests:
        left.acquire()
    return [outs[r.request_id] for r in requests]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--model", type=Path, default=None, help="another GGUF (default: SmolLM2)")
    ap.add_argument("--shipped-only", action="store_true", help="flash attention on only (as served)")
    args = ap.parse_args()
    print("| flash attention | requests differing (batched vs alone) | first differing token (position) |")
    print("|---|---|---|")
    for fa in (True,) if args.shipped_only else (True, False):
        runner = LlamaCppRunner(args.model or default_model_path(), n_slots=16, n_ctx=1024, flash_attn=fa)
        engine = Engine(runner)
        engine.start()

        def reqs(tag: str, runner: LlamaCppRunner = runner) -> list[EngineRequest]:
            out = []
            for i, raw in enumerate(bodies()):
                b: dict[str, Any] = dict(raw)
                params = SamplingParams(
                    max_new_tokens=args.new_tokens, temperature=b["temperature"], top_k=b.get("top_k", 0),
                    top_p=b.get("top_p", 1.0), seed=b.get("seed"), ignore_eos=True,
                )
                out.append(EngineRequest(f"{tag}{i}", runner.tokenize(str(b["prompt"])), params))
            return out

        lengths = [len(r.prompt_ids) for r in reqs("n")]
        alone = [run(engine, [r])[0] for r in reqs("a")]
        together = run(engine, reqs("b"))
        engine.stop()
        runner.close()
        firsts = []
        for a, t, n in zip(alone, together, lengths, strict=True):
            if a != t:
                i = next(i for i, (x, y) in enumerate(zip(a, t, strict=True)) if x != y)
                firsts.append(f"{i} ({n + i})")
        label = "on (llama.cpp default)" if fa else "off (sluicegate)"
        print(f"| {label} | {len(firsts)}/{len(alone)} | {', '.join(firsts) or '-'} |", flush=True)


if __name__ == "__main__":
    main()
