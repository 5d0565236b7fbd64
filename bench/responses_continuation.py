"""Responses API: continuing a stored conversation by `previous_response_id` against sending it all again.

    flock /work/helpers/bench.lock .venv/bin/python bench/responses_continuation.py [--conversations 6]
        [--turns 4] [--max-tokens 48] [--write]

One sluicegate as shipped (the real model, one slot per client; bench/concurrency.py's server), one client.
Each conversation has `--turns` turns of streamed `POST /v1/responses`, greedy, each reply at most
`--max-tokens` tokens (Responses takes no logit_bias, so end-of-text cannot be banned; both modes get the same
replies, since the prompts are the same tokens):

  continue  each turn sends only the new user message and `previous_response_id` (the server reads the stored
            conversation and renders it with the new message)
  resend    each turn sends the whole conversation as items (every earlier user message and the replies the
            server gave, passed back as output items), `store: false`
  cold      as resend, but each turn's instructions carry the turn's number too, so the prefix cache holds
            none of the prompt: what the same turn costs without the cache

The modes take turns conversation by conversation (the machine's speed drifts over minutes); every
conversation's instructions carry its own number, so no conversation reuses another's prefix cache. TTFT is
from sending the request to the first `response.output_text.delta`, over turns 2.. (turn 1 is the same request
in both modes); "cached" is the share of those turns' input tokens the prefix cache served
(`usage.input_tokens_details.cached_tokens`), and "request bytes" the median body size of the last turn.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.concurrency import model_of, server
from bench.report import percentile, write_section

HEADING = "## Responses: continuing by previous_response_id against resending the conversation"
INSTRUCTIONS = "You are a helpful assistant in conversation {n}. Answer in plain words and stay on the topic."
MODES = ("continue", "resend", "cold")
TURNS = ["Tell me about lighthouses.", "Who kept them?", "How did they live?", "What changed with electricity?",
         "Summarise all of that.", "Thank you."]


def turn(c: httpx.Client, body: dict[str, Any]) -> tuple[float, dict[str, Any], int]:
    """One streamed request: (TTFT seconds, the final response, request bytes)."""
    raw = json.dumps(body).encode()
    t0 = time.perf_counter()
    first: float | None = None
    final: dict[str, Any] | None = None
    with c.stream("POST", "/v1/responses", content=raw, headers={"Content-Type": "application/json"}) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            ev = json.loads(line[6:])
            if ev["type"] == "response.output_text.delta" and first is None:
                first = time.perf_counter() - t0
            if ev["type"] in ("response.completed", "response.incomplete"):
                final = ev["response"]
            if "error" in ev and "type" not in ev:  # the error event's envelope
                raise RuntimeError(f"stream failed: {ev}")
    if final is None or first is None:
        raise RuntimeError("no text, or no final response")
    return first, final, len(raw)


def conversation(c: httpx.Client, model: str, n: int, mode: str, turns: int, max_tokens: int
                 ) -> tuple[list[float], int, int, int]:
    """(TTFTs of turns 2.., input tokens and cached tokens of turns 2.., bytes of the last request)."""
    base = {"model": model, "max_output_tokens": max_tokens, "temperature": 0, "stream": True}
    items: list[Any] = []
    previous: str | None = None
    ttfts: list[float] = []
    inp = cached = size = 0
    for k in range(turns):
        user = {"role": "user", "content": TURNS[k % len(TURNS)]}
        instructions = INSTRUCTIONS.format(n=f"{n}.{k}" if mode == "cold" else n)
        if mode == "continue":
            body = {**base, "instructions": instructions, "input": [user],
                    **({"previous_response_id": previous} if previous else {})}
        else:
            body = {**base, "instructions": instructions, "input": [*items, user], "store": False}
        ttft, final, size = turn(c, body)
        items += [user, *final["output"]]
        previous = final["id"]
        if k > 0:
            ttfts.append(ttft)
            inp += final["usage"]["input_tokens"]
            cached += final["usage"]["input_tokens_details"]["cached_tokens"]
    return ttfts, inp, cached, size


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--conversations", type=int, default=6, help="per mode")
    ap.add_argument("--turns", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=48)
    ap.add_argument("--write", action="store_true", help="write the section of docs/benchmarks.md")
    args = ap.parse_args()
    stats: dict[str, dict[str, Any]] = {m: {"ttft": [], "inp": 0, "cached": 0, "size": []}
                                         for m in MODES}
    with tempfile.TemporaryDirectory() as tmp, server("sluicegate", 1, Path(tmp) / "server.log") as url, \
            httpx.Client(base_url=url, timeout=600) as c:
        model = model_of(url)
        for i in range(len(MODES) * args.conversations):
            mode = MODES[(i + i // len(MODES)) % len(MODES)]  # the first mode rotating round by round
            ttfts, inp, cached, size = conversation(c, model, i, mode, args.turns, args.max_tokens)
            s = stats[mode]
            s["ttft"] += ttfts
            s["inp"] += inp
            s["cached"] += cached
            s["size"].append(size)
            print(f"{mode} #{i}: TTFT {[round(t * 1000) for t in ttfts]} ms, cached {cached}/{inp}", flush=True)
    rows = []
    for mode, s in stats.items():
        ms = [t * 1000 for t in s["ttft"]]
        rows.append(f"| {mode} | {len(ms)} | {statistics.median(ms):.0f} | {percentile(ms, .95):.0f} | "
                    f"{100 * s['cached'] / max(1, s['inp']):.0f}% | {statistics.median(s['size']):.0f} |")
        print(rows[-1])
    if args.write:
        cmd = (f"flock /work/helpers/bench.lock .venv/bin/python bench/responses_continuation.py --conversations "
               f"{args.conversations} --turns {args.turns} --max-tokens {args.max_tokens} --write")
        write_section(HEADING, "\n".join([
            HEADING, "", f"Command: `{cmd}` ({time.strftime('%Y-%m-%d %H:%M', time.gmtime())} UTC). One client, "
            "streamed, greedy; the modes and the measure are in the script's docstring. TTFT over turns 2.. of "
            "every conversation.", "",
            "| mode | turns measured | TTFT p50 ms | TTFT p95 ms | input tokens cached | last request bytes |",
            "|---|---|---|---|---|---|", *rows, "",
        ]))


if __name__ == "__main__":
    main()
