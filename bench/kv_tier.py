"""Many conversations over few slots, through the engine alone: the host-memory KV tier on against off.

    flock /work/helpers/bench.lock .venv/bin/python bench/kv_tier.py [--conversations 16] [--slots 4]
        [--turns 3] [--max-tokens 32]

`--conversations` client threads each hold one conversation: a shared system prompt, its own question, then
per turn the reply it got and a follow-up, resent whole each turn (greedy, end-of-text banned, so every reply
is `--max-tokens` tokens). All start at once over `--slots` slots, so a returning conversation finds its slot
taken by another: without the tier its history is prefilled again, with it the history is restored. Run
twice in one process, tier off (`kv_cache_bytes=0`) then on (1 GiB); prints prompt tokens computed, tokens
reused, the tier's hits, and the time to first token of turns 2 and later (submit to first token), and checks
that both runs gave the same replies.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.report import percentile
from sluicegate.backends.llama_cpp import LlamaCppRunner, default_model_path
from sluicegate.engine import Engine, EngineRequest, RequestOutput, SamplingParams, SchedulerConfig

SYSTEM = ("You are a helpful assistant. Answer in plain words, briefly, and stay on the topic. If you do not "
          "know, say so. Keep every answer short enough to read aloud in under a minute.")
QUESTIONS = ["What is a lighthouse?", "How does bread rise?", "Why is the sky blue?", "How do I start at chess?",
             "Why does a bicycle stay up?", "What is the water cycle?", "How do I make good coffee?",
             "Why do birds migrate?"]
FOLLOW_UPS = ["Tell me more.", "Give me an example.", "Summarise that in one sentence."]


class Reply:
    def __init__(self) -> None:
        self.ids: list[int] = []
        self.first: float | None = None
        self.done = threading.Event()

    def __call__(self, out: RequestOutput) -> None:
        if out.new_token_ids and self.first is None:
            self.first = time.monotonic()
        self.ids += out.new_token_ids
        if out.finished:
            self.done.set()


def run(args: argparse.Namespace, tier_bytes: int) -> dict[str, object]:
    runner = LlamaCppRunner(default_model_path(), n_ctx=1024, n_slots=args.slots)
    eng = Engine(runner, SchedulerConfig(kv_cache_bytes=tier_bytes))
    eng.start()
    eos = sorted(runner.limits.eos_ids)
    ttft: list[float] = []
    replies: dict[tuple[int, int], list[int]] = {}
    lock = threading.Lock()

    def conversation(i: int) -> None:
        ids = runner.tokenize(f"{SYSTEM}\nUser: {QUESTIONS[i % len(QUESTIONS)]} (conversation {i})\nAssistant:")
        for turn in range(args.turns):
            r = Reply()
            params = SamplingParams(max_new_tokens=args.max_tokens, temperature=0.0,
                                    logit_bias={t: -1e9 for t in eos})
            began = time.monotonic()
            eng.submit(EngineRequest(f"c{i}t{turn}", list(ids), params), r)
            assert r.done.wait(1800) and r.first is not None
            with lock:
                replies[(i, turn)] = r.ids
                if turn:
                    ttft.append(r.first - began)
            follow = FOLLOW_UPS[turn % len(FOLLOW_UPS)]
            ids = ids + r.ids + runner.tokenize(f"\nUser: {follow}\nAssistant:", add_special=False)

    began = time.monotonic()
    threads = [threading.Thread(target=conversation, args=(i,)) for i in range(args.conversations)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.monotonic() - began
    snap = eng.stats.snapshot()
    eng.stop()
    eng.close()
    ttft.sort()
    return {"replies": replies, "wall": wall, "computed": int(snap["prompt_tokens"]),
            "cached": int(snap["cached_tokens"]), "hits": int(snap["kv_tier_hits"]),
            "tier_mb": snap["kv_tier_bytes"] / 2**20, "ttft_p50": statistics.median(ttft),
            "ttft_p90": percentile(ttft, 0.9), "ttft_mean": statistics.fmean(ttft)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--conversations", type=int, default=16)
    ap.add_argument("--slots", type=int, default=4)
    ap.add_argument("--turns", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=32)
    args = ap.parse_args()
    off = run(args, 0)
    on = run(args, 1 << 30)
    print(f"{args.conversations} conversations x {args.turns} turns over {args.slots} slots, "
          f"{args.max_tokens} tokens a reply")
    print("| KV tier | prompt tokens computed | reused | tier hits | tier MiB | TTFT turns 2+ p50 / p90 / mean (s) "
          "| wall (s) |")
    print("|---|---:|---:|---:|---:|---|---:|")
    for name, r in (("off", off), ("on", on)):
        print(f"| {name} | {r['computed']} | {r['cached']} | {r['hits']} | {r['tier_mb']:.1f} | "
              f"{r['ttft_p50']:.2f} / {r['ttft_p90']:.2f} / {r['ttft_mean']:.2f} | {r['wall']:.1f} |")
    same = off["replies"] == on["replies"]
    print(f"replies identical tier on and off: {same}")
    if not same:
        sys.exit(1)


if __name__ == "__main__":
    main()
