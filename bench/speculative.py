"""Speculative decoding (prompt lookup, `--speculative-ngram`): tokens/s at 1 client, off, adaptive and fixed.

    flock /tmp/sluicegate-bench.lock .venv/bin/python bench/speculative.py --write     # the full run
    ... bench/speculative.py --rounds 1 --requests 1 --max-tokens 8                    # a smoke run

Three of our servers, one slot each, 2 threads, same GGUF: `off` (`--speculative-ngram 0`), `auto` (as shipped:
adaptive drafts, engine/speculative.py's DraftPolicy), and `spec-K` (`--speculative-ngram K`, `--k`, default 5:
K drafts whenever a match is found; n-grams of 3 down to 2). One client, streaming `POST /v1/chat/completions`, greedy,
end-of-text banned (every reply is exactly `--max-tokens` tokens), on two workloads by default and a third on
request (`--workloads repeat,unique,filler`):

  repeat   "rewrite / copy / extract from this paragraph": the answer repeats its input, so drafts taken
           from the prompt are often right
  unique   open questions with nothing to copy: drafts come only from the reply's own repetitions
  filler   bench/concurrency.py's unique prompts ("Write about X." and a paragraph of instructions repeated
           1-5 times): the prompt repeats itself, the reply does not, so lookups find matches that are wrong

All servers run at once and take turns, `--rounds` times with the first rotating; tokens/s is the median
round's (generated tokens / wall time), the speed-up the median of per-round ratios against `off`; the
acceptance rate is accepted / drafted tokens from each server's /metrics over all rounds. With flash attention
(the default) the replies are the same on all three (tests/e2e/test_speculative_e2e.py checks it).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.concurrency import ROUTE, Level, body, closed_loop, model_of, ours
from bench.concurrency import prompt as filler_prompt
from bench.report import percentile, publish

HEADING = "## Speculative decoding (prompt lookup) at 1 client"
PARAGRAPHS = [
    "The old lighthouse stood on the northern cliff for more than a century. Every night its keeper climbed "
    "the narrow stairs, trimmed the wick and wound the clockwork that turned the great lens, so that ships "
    "passing the rocks could see the beam from twenty miles away.",
    "Bread rises because yeast feeds on the sugars in the flour and gives off carbon dioxide. The gas is "
    "trapped by the gluten network that forms when the dough is kneaded, and the bubbles grow until the loaf "
    "is baked and the structure sets in the heat of the oven.",
    "A bicycle stays upright mostly because the rider steers into the direction of a fall. The geometry of the "
    "front fork helps: when the bicycle leans, the front wheel turns toward the lean, bringing the wheels back "
    "under the centre of mass without the rider thinking about it.",
]
TASKS = ["Repeat the following paragraph exactly, word for word:", "Rewrite the following paragraph, keeping "
         "its words where you can:", "Copy out every sentence of this paragraph, one per line:"]
QUESTIONS = ["Why is the sky blue?", "How do I start playing chess?", "What makes a good cup of coffee?",
             "Why do birds migrate in winter?", "How does a refrigerator keep food cold?"]


def prompts(workload: str, n: int, rnd: int) -> list[str]:
    if workload == "repeat":
        return [f"{TASKS[(i + rnd) % len(TASKS)]}\n\n{PARAGRAPHS[i % len(PARAGRAPHS)]}" for i in range(n)]
    if workload == "filler":
        return [filler_prompt(i, rnd) for i in range(n)]
    return [f"(round {rnd}) {QUESTIONS[i % len(QUESTIONS)]} Explain in a few sentences." for i in range(n)]


def spec_counters(url: str) -> tuple[float, float]:
    """(drafted, accepted) tokens so far, from /metrics."""
    got = {"spec_draft_tokens": 0.0, "spec_accepted_tokens": 0.0}
    with contextlib.suppress(httpx.HTTPError):
        for line in httpx.get(f"{url}/metrics", timeout=10).text.splitlines():
            for name in got:
                if line.startswith(f"sluicegate_{name}_total"):
                    got[name] += float(line.rsplit(" ", 1)[1])
    return got["spec_draft_tokens"], got["spec_accepted_tokens"]


Runs = dict[str, dict[str, list[Level]]]  # workload -> server -> one Level per round
Drafts = dict[tuple[str, str], tuple[float, float]]  # (workload, server) -> (drafted, accepted) over its rounds


def run(workloads: list[str], k: int, rounds: int, n_req: int, max_tokens: int, log: Path) -> tuple[Runs, Drafts]:
    kinds = {"off": ["--speculative-ngram", "0"], "auto": [], f"spec-{k}": ["--speculative-ngram", str(k)]}
    out: Runs = {w: {kind: [] for kind in kinds} for w in workloads}
    acc: Drafts = {(w, kind): (0.0, 0.0) for w in workloads for kind in kinds}
    with contextlib.ExitStack() as stack:
        urls = {kind: stack.enter_context(ours(1, log, *extra)) for kind, extra in kinds.items()}
        models = {kind: model_of(u) for kind, u in urls.items()}
        names = list(kinds)
        for w in workloads:
            for r in range(rounds):
                bodies = [body(p, max_tokens) for p in prompts(w, n_req, r)]
                for kind in names[r % len(names):] + names[: r % len(names)]:
                    lv = Level(kind, 1)
                    before = spec_counters(urls[kind])
                    asyncio.run(closed_loop(urls[kind], models[kind], lv, bodies))
                    after = spec_counters(urls[kind])
                    was = acc[(w, kind)]
                    acc[(w, kind)] = (was[0] + after[0] - before[0], was[1] + after[1] - before[1])
                    out[w][kind].append(lv)
                    print(f"{w} {kind} round {r + 1}: {lv.tokens} tokens, {lv.tps:.1f} tok/s, "
                          f"{percentile(lv.tpot, .5):.1f} ms/token, "
                          f"drafted {after[0] - before[0]:.0f}, accepted {after[1] - before[1]:.0f}, "
                          f"errors {lv.errors}", flush=True)
    return out, acc


def table(runs: Runs, drafts: Drafts) -> str:
    rows = ["| workload | server | tokens/s | ms/token p50 | latency p50 ms | drafts accepted | speed-up (per round) |",
            "|---|---|---|---|---|---|---|"]
    for w, by_kind in runs.items():
        plain = by_kind["off"]
        for kind, lvs in by_kind.items():
            drafted, accepted = drafts[(w, kind)]
            tps = sorted(lv.tps for lv in lvs)[len(lvs) // 2]
            tpot = percentile([t for lv in lvs for t in lv.tpot], .5)
            lat = percentile([t for lv in lvs for t in lv.latency], .5)
            rate = f"{accepted / drafted:.0%} of {drafted:.0f}" if drafted else ""
            ratio = ""
            if kind != "off":
                per = sorted(a.tps / b.tps for a, b in zip(lvs, plain, strict=True) if b.tps)
                ratio = f"{per[len(per) // 2]:.2f}x ({', '.join(f'{x:.2f}' for x in per)})" if per else ""
            rows.append(f"| {w} | {kind} | {tps:.1f} | {tpot:.1f} | {lat:.0f} | {rate} | {ratio} |")
    return "\n".join(rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--k", type=int, default=5, help="--speculative-ngram of the speculative server")
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--requests", type=int, default=6, help="requests per round")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--workloads", default="repeat,unique")
    ap.add_argument("--log", type=Path, default=Path("/tmp/sluicegate-bench-servers.log"))
    ap.add_argument("--write", action="store_true", help=f"replace docs/benchmarks.md's '{HEADING[3:]}'")
    args = ap.parse_args()
    ROUTE["path"] = "/v1/chat/completions"
    runs, drafts = run(args.workloads.split(","), args.k, args.rounds, args.requests, args.max_tokens, args.log)
    cmd = " ".join(["bench/speculative.py", *sys.argv[1:]])
    text = "\n".join([
        HEADING, "",
        f"`{cmd}`: 1 client, streaming chat, greedy, {args.max_tokens} tokens per reply, {args.requests} requests "
        f"per round, {args.rounds} interleaved rounds (bench/speculative.py's docstring has the workloads).", "",
        table(runs, drafts),
    ])
    publish(HEADING, text, args.write)


if __name__ == "__main__":
    main()
