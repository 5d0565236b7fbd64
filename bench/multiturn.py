"""Everyday chat traffic, side by side with llama.cpp's llama-server: where token-granular prefix reuse pays.

    flock /tmp/sluicegate-bench.lock .venv/bin/python bench/multiturn.py --write          # the full run
    ... bench/multiturn.py --levels 1 --rounds 1 --max-tokens 8 --servers sluicegate      # a smoke run

Two workloads, streaming `POST /v1/chat/completions`, greedy, end-of-text banned (every reply is exactly
`--max-tokens` tokens), the same servers and settings as bench/concurrency.py (same GGUF, 2 threads, one
slot per client, 1,024 positions per slot):

  short-shared  8 short user prompts behind one ~30-token system prompt, repeated: N clients in a closed
                loop, max(4N, 16) requests (each prompt recurs, so a server can reuse the whole prompt,
                not only the system prompt)
  multi-turn    conversations of 4 turns (system prompt, then user/assistant turns), each turn resending
                the whole history with the replies the server gave; N clients, each running conversations
                one after the other, 2N conversations
  many-conversations  more conversations than slots: each of N clients interleaves `--conversations-per-client`
                (4) conversations turn by turn (turn 1 of each, then turn 2 of each, ...), `--turns` (4) turns,
                so a conversation comes back for its next turn after 4N others were served and its slot has
                been taken (what a chat app with many users sends); TTFT of turns 2+ reported apart

All servers run at once and take turns, `--rounds` times with the first server rotating; tokens/s is the
median round's, the ratio the median of per-round ratios against llama-server, TTFT and latency percentiles
over every round. "reused" is the share of prompt tokens the server reported as cached
(`usage.prompt_tokens_details.cached_tokens`; llama-server reports it too). Each round's prompts carry the
round number in the system prompt, so no round reuses another's cache.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.concurrency import BANNED_EOS, Level, model_of, pooled, server
from bench.report import percentile, publish

HEADING = "## Everyday chat: short shared prompts and multi-turn conversations"
SYSTEM = "You are a helpful assistant for session {r}. Answer in plain words, briefly, and stay on the topic."
QUESTIONS = [
    "What is a lighthouse?", "How does bread rise?", "Why is the sky blue?", "How do I start at chess?",
    "Why does a bicycle stay up?", "What is the water cycle?", "How do I make good coffee?",
    "Why do birds migrate?",
]
FOLLOW_UPS = ["Tell me more.", "Give me an example.", "Summarise that in one sentence."]


@dataclass
class Stats(Level):
    prompt_tokens: int = 0  # as the server reported them
    cached_tokens: int = 0
    later_ttft: list[float] = field(default_factory=list)  # many-conversations: TTFT of turns 2+ (ms)


async def turn(c: httpx.AsyncClient, model: str, messages: list[dict[str, str]], max_tokens: int,
               st: Stats) -> str:
    """One streamed chat request; returns the reply's text (for the next turn's history)."""
    body = {"model": model, "messages": messages, "max_tokens": max_tokens, "temperature": 0.0,
            "logit_bias": BANNED_EOS, "stream": True, "stream_options": {"include_usage": True}}
    t0 = time.perf_counter()
    first: float | None = None
    parts: list[str] = []
    usage: dict[str, Any] | None = None
    for attempt in (1, 2):  # a keep-alive connection the server closed as it was reused: once more, fresh
        try:
            async with c.stream("POST", "/v1/chat/completions", json=body) as r:
                if r.status_code != 200:
                    st.errors += 1
                    await r.aread()
                    return ""
                async for line in r.aiter_lines():
                    if not line.startswith("data: ") or line == "data: [DONE]":
                        continue
                    data = json.loads(line[6:])
                    usage = data.get("usage") or usage
                    for ch in data.get("choices") or []:
                        piece = (ch.get("delta") or {}).get("content")
                        if piece:
                            parts.append(piece)
                            first = first or time.perf_counter()
            break
        except httpx.RemoteProtocolError:
            if attempt == 2 or parts or usage:
                raise
            t0 = time.perf_counter()
    end = time.perf_counter()
    st.ttft.append(((first or end) - t0) * 1e3)
    st.latency.append((end - t0) * 1e3)
    if usage:
        n = int(usage.get("completion_tokens", 0))
        st.tokens += n
        st.prompt_tokens += int(usage.get("prompt_tokens", 0))
        st.cached_tokens += int((usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0))
        if first is not None and n > 1:
            st.tpot.append((end - first) * 1e3 / (n - 1))
    return "".join(parts)


async def short_shared(c: httpx.AsyncClient, model: str, st: Stats, rnd: int, max_tokens: int,
                       size: int | None = None) -> None:
    n = size or max(4 * st.clients, 2 * len(QUESTIONS))
    queue = [QUESTIONS[(rnd * n + i) % len(QUESTIONS)] for i in range(n)]

    async def client() -> None:
        while queue:
            q = queue.pop(0)
            msgs = [{"role": "system", "content": SYSTEM.format(r=rnd)}, {"role": "user", "content": q}]
            await turn(c, model, msgs, max_tokens, st)

    await asyncio.gather(*(client() for _ in range(st.clients)))


async def multi_turn(c: httpx.AsyncClient, model: str, st: Stats, rnd: int, max_tokens: int,
                     size: int | None = None) -> None:
    n = size or 2 * st.clients
    convs = list(range(rnd * n, rnd * n + n))

    async def client() -> None:
        while convs:
            k = convs.pop(0)
            msgs = [{"role": "system", "content": SYSTEM.format(r=rnd)}]
            for user in [QUESTIONS[k % len(QUESTIONS)], *FOLLOW_UPS]:
                msgs.append({"role": "user", "content": user})
                reply = await turn(c, model, msgs, max_tokens, st)
                msgs.append({"role": "assistant", "content": reply})

    await asyncio.gather(*(client() for _ in range(st.clients)))


CONVERSATIONS_PER_CLIENT = 4  # many-conversations (--conversations-per-client)
TURNS = 4  # many-conversations (--turns)


async def many_conversations(c: httpx.AsyncClient, model: str, st: Stats, rnd: int, max_tokens: int,
                             size: int | None = None) -> None:
    per = size or CONVERSATIONS_PER_CLIENT
    users = [QUESTIONS, *[[f] * len(QUESTIONS) for f in FOLLOW_UPS]]

    async def client(i: int) -> None:
        convs = [[{"role": "system", "content": SYSTEM.format(r=rnd)}] for _ in range(per)]
        for t in range(TURNS):
            for j, msgs in enumerate(convs):
                k = i * per + j
                msgs.append({"role": "user", "content": f"{users[t % len(users)][k % len(QUESTIONS)]} (#{k})"})
                before = len(st.ttft)
                reply = await turn(c, model, msgs, max_tokens, st)
                msgs.append({"role": "assistant", "content": reply})
                if t and len(st.ttft) > before:
                    st.later_ttft.append(st.ttft[-1])

    await asyncio.gather(*(client(i) for i in range(st.clients)))


WORKLOADS = {"short-shared": short_shared, "multi-turn": multi_turn, "many-conversations": many_conversations}


def run_level(kinds: list[str], workload: str, n: int, rounds: int, max_tokens: int, log: Path,
              size: int | None = None) -> dict[str, list[Stats]]:
    """`size`: requests (short-shared) or conversations (multi-turn) a round, instead of the default."""
    out: dict[str, list[Stats]] = {k: [] for k in kinds}
    with contextlib.ExitStack() as stack:
        urls = {k: stack.enter_context(server(k, n, log)) for k in kinds}
        models = {k: model_of(u) for k, u in urls.items()}
        for r in range(rounds):
            for kind in kinds[r % len(kinds):] + kinds[: r % len(kinds)]:
                st = Stats(kind, n)
                asyncio.run(_timed(urls[kind], models[kind], st, workload, r, max_tokens, size))
                out[kind].append(st)
                share = st.cached_tokens / st.prompt_tokens if st.prompt_tokens else 0.0
                print(f"{workload} {kind} x{n} round {r + 1}: {st.tps:.1f} tok/s, TTFT p50 "
                      f"{percentile(st.ttft, .5):.0f} ms p95 {percentile(st.ttft, .95):.0f} ms, reused {share:.0%} of "
                      f"{st.prompt_tokens} prompt tokens, errors {st.errors}", flush=True)
    return out


async def _timed(url: str, model: str, st: Stats, workload: str, rnd: int, max_tokens: int,
                 size: int | None) -> None:
    limits = httpx.Limits(max_connections=st.clients + 4)
    async with httpx.AsyncClient(base_url=url, timeout=600, limits=limits) as c:
        await turn(c, model, [{"role": "user", "content": "Warm-up. Say hello."}], 4, Stats("warmup", 1))
        t0 = time.perf_counter()
        await WORKLOADS[workload](c, model, st, rnd, max_tokens, size)
        st.wall = time.perf_counter() - t0


def table(workload: str, runs: dict[tuple[str, int], list[Stats]], kinds: list[str], levels: list[int]) -> str:
    rows = [f"\n**{workload}**\n", "| clients | server | tokens/s | TTFT p50 ms | TTFT p95 ms | TTFT turns 2+ p50 ms "
            "| latency p50 ms | prompt tokens reused | ratio (per round) |", "|---|---|---|---|---|---|---|---|---|"]
    for n in levels:
        peer_runs = runs.get(("llama-server", n))
        for kind in kinds:
            lvs = runs[(kind, n)]
            as_levels: list[Level] = list(lvs)
            r = pooled(as_levels)
            prompt = sum(s.prompt_tokens for s in lvs)
            reused = f"{sum(s.cached_tokens for s in lvs) / prompt:.0%}" if prompt else "n/a"
            ratio = ""
            if kind != "llama-server" and peer_runs:
                per = sorted(a.tps / b.tps for a, b in zip(lvs, peer_runs, strict=True) if b.tps)
                ratio = f"{per[len(per) // 2]:.2f}x ({', '.join(f'{x:.2f}' for x in per)})"
            later = [x for s in lvs for x in s.later_ttft]
            rows.append(f"| {n} | {kind} | {r.tps:.1f} | {percentile(r.ttft, .5):.0f} | "
                        f"{percentile(r.ttft, .95):.0f} | {f'{percentile(later, .5):.0f}' if later else '-'} | "
                        f"{percentile(r.latency, .5):.0f} | {reused} | {ratio} |")
    return "\n".join(rows)


def main() -> None:
    global CONVERSATIONS_PER_CLIENT, TURNS
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--levels", default="1,16")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--per-round", type=int, default=None,
                    help="requests (short-shared) or conversations (multi-turn) a round; 1 at one client "
                         "alternates the servers conversation by conversation")
    ap.add_argument("--workloads", default="short-shared,multi-turn")
    ap.add_argument("--conversations-per-client", type=int, default=CONVERSATIONS_PER_CLIENT,
                    help="many-conversations: conversations each client interleaves")
    ap.add_argument("--turns", type=int, default=TURNS, help="many-conversations: turns a conversation")
    ap.add_argument("--servers", default="sluicegate,llama-server")
    ap.add_argument("--log", type=Path, default=Path("/tmp/sluicegate-bench-servers.log"))
    ap.add_argument("--write", action="store_true", help=f"replace docs/benchmarks.md's '{HEADING[3:]}'")
    args = ap.parse_args()
    CONVERSATIONS_PER_CLIENT, TURNS = args.conversations_per_client, args.turns
    levels = [int(x) for x in args.levels.split(",")]
    kinds = args.servers.split(",")
    tables = []
    for workload in args.workloads.split(","):
        runs: dict[tuple[str, int], list[Stats]] = {}
        for n in levels:
            for kind, sts in run_level(kinds, workload, n, args.rounds, args.max_tokens, args.log,
                                       args.per_round).items():
                runs[(kind, n)] = sts
        tables.append(table(workload, runs, kinds, levels))
    cmd = " ".join(["bench/multiturn.py", *sys.argv[1:]])
    text = "\n".join([
        HEADING, "",
        f"`{cmd}`: streaming chat, greedy, {args.max_tokens} tokens per reply, {args.rounds} interleaved "
        "rounds (bench/multiturn.py's docstring has the workloads).", *tables,
    ])
    publish(HEADING, text, args.write)


if __name__ == "__main__":
    main()
