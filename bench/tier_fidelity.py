"""Does the host-memory KV tier change an output? In process, the 32 requests of tests/e2e/test_batching.py.

    flock /tmp/sluicegate-bench.lock .venv/bin/python bench/tier_fidelity.py [--slots 16] [--rounds 4]

One engine (LlamaCppRunner, `--slots` slots, the KV tier on with 1 GiB): the 32 requests one at a time (the
reference; their slots are evicted to the tier as the next ones come), then `--rounds` rounds of all 32 at
once in a shuffled order, each compared token for token with the reference. The later rounds restore most
prompts from the tier, and one step often admits a request that copies a prefix from a slot beside one
restored into that slot: the case docs/engine.md ("KV tier", "Copies land in op order") is about. Prints, per
round, the requests whose tokens differ (index, first differing position) and the tier's counters.
"""

from __future__ import annotations

import argparse
import random
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tests.e2e.test_batching import bodies

from bench.fidelity import run
from sluicegate.backends.llama_cpp import LlamaCppRunner, default_model_path
from sluicegate.engine import Engine, EngineRequest, SamplingParams, SchedulerConfig


def requests(runner: LlamaCppRunner, tag: str, new_tokens: int) -> list[EngineRequest]:
    out = []
    for i, raw in enumerate(bodies()):
        b: dict[str, Any] = dict(raw)
        params = SamplingParams(max_new_tokens=new_tokens, temperature=b["temperature"], top_k=b.get("top_k", 0),
                                top_p=b.get("top_p", 1.0), seed=b.get("seed"))
        out.append(EngineRequest(f"{tag}{i}", runner.tokenize(str(b["prompt"])), params))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--slots", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--new-tokens", type=int, default=24)
    args = ap.parse_args()
    runner = LlamaCppRunner(default_model_path(), n_slots=args.slots)
    engine = Engine(runner, SchedulerConfig(kv_cache_bytes=1 << 30))
    engine.start()
    try:
        reference = [run(engine, [r])[0] for r in requests(runner, "ref", args.new_tokens)]
        rng = random.Random(1)
        for rnd in range(args.rounds):
            reqs = requests(runner, f"r{rnd}-", args.new_tokens)
            order = list(range(len(reqs)))
            rng.shuffle(order)
            got = run(engine, [reqs[i] for i in order])
            differ = []
            for j, i in enumerate(order):
                if got[j] != reference[i]:
                    first = next((k for k, (x, y) in enumerate(zip(got[j], reference[i], strict=False)) if x != y),
                                 min(len(got[j]), len(reference[i])))
                    differ.append(f"{i}@{first}")
            slots = engine.scheduler.slots
            print(f"round {rnd + 1}: {len(differ)}/{len(reqs)} differ {' '.join(differ) or '-'}; tier hits "
                  f"{slots.tier_hits}, restored tokens {slots.restored_tokens}, saves {engine.kv_tier.saves}",
                  flush=True)
    finally:
        engine.stop()
        runner.close()


if __name__ == "__main__":
    main()
