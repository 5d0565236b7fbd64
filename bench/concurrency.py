"""Throughput and latency under concurrency, side by side with llama.cpp's own llama-server.

    flock /tmp/sluicegate-bench.lock .venv/bin/python bench/concurrency.py            # the full run
    ... bench/concurrency.py --levels 1,16 --max-tokens 64                            # a quicker one
    ... bench/concurrency.py --route chat --levels 1,16 --max-tokens 64 --skip-shared  # streaming chat

Three servers: sluicegate as it ships (flash attention, kept on its one-row path so batching never
changes an output), sluicegate with `--no-flash-attn` (the plain attention kernels), and llama-server.
All get the same GGUF, 2 threads, one slot per concurrent client (llama-server `-np N`), 1,024 positions
per slot, and the same requests: streaming
`POST /v1/completions` (or, with `--route chat`, `POST /v1/chat/completions` with the prompt as one user
message) with one JSON body shape (greedy; end-of-text banned by logit_bias, so every request generates
exactly `--max-tokens` tokens). For our servers the event loop's CPU per streamed token is read from
/proc (the server's main thread, which runs the event loop; the engine and llama.cpp have their own).
Closed loop: N clients, each sending its next request as soon as the previous one ends, for
max(3N, 12) requests per level and round. All servers of a level run at once and take turns, `--rounds` times
with the first server rotating; tokens/s is the median round's, the ratio the median of the per-round
ratios, TTFT and latency percentiles are over every round's requests. Measured on the client, per request:
TTFT = send -> first streamed token; latency = send -> end of stream. Throughput = generated tokens / wall
time of the round. Each prompt starts with its own round and request number, so no prompt shares a prefix
with another (neither server's cache helps).

Then the shared-system-prompt workload (`--shared-level` clients): a ~400-token system prompt + a distinct
question, run with the system prompt shared and with it made unique per request (same length), on each of
`--servers` (ours: the prefix cache; llama-server: its per-slot prompt cache).
Results print as the markdown tables in docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.common import free_port, fresh_data_dir, launch, serve_command
from bench.report import percentile

ROOT = Path(__file__).resolve().parent.parent
PEER = ROOT / ".peer" / "venv" / "bin"
CTX_PER_SLOT = 1024
BANNED_EOS = {"0": -100, "2": -100}  # <|endoftext|>, <|im_end|> (`--banned-eos` for another model's)
MODEL: dict[str, Path | None] = {"gguf": None, "template": None}  # `--model`, `--chat-template-file` (both servers)

TOPICS = [
    "the history of lighthouses and the people who kept them",
    "how bread rises, from yeast to oven",
    "why the sky is blue during the day and red at sunset",
    "the rules of chess for a complete beginner",
    "how a bicycle stays upright while moving",
    "the water cycle explained for children",
    "what makes a good cup of coffee",
    "the migration of birds across continents",
]
FILLER = (
    "Please be concrete, use short sentences, and give one example. Avoid lists unless they help. "
    "Assume the reader is curious but has no background in the subject. "
)
SYSTEM = (
    "You are a patient tutor for adult learners. You explain one idea at a time, check the reader's "
    "understanding with a short question, and never use jargon without defining it first. When a question "
    "is ambiguous you say how you read it. You prefer examples from everyday life: kitchens, streets, "
    "gardens, buses and markets. You keep answers under two hundred words and end with one suggestion for "
    "what to read or try next. "
) * 4


def n_requests(clients: int) -> int:
    """Requests in one round of a level: three per client, at least 12."""
    return max(3 * clients, 12)


def prompt(i: int, round_: int = 0) -> str:
    """Distinct from the first token, in every round (llama-server keeps past prompts in RAM); 40 to 200 tokens."""
    return f"Request {round_}.{i}. Write about {TOPICS[i % len(TOPICS)]}. " + FILLER * (1 + i % 5)


ROUTE = {"path": "/v1/completions"}  # set by --route
PIDS: dict[str, int] = {}  # our servers' url -> pid, for the event loop's CPU


def loop_cpu_s(url: str) -> float:
    """CPU seconds of the server's main thread (the event loop) so far; 0 for servers not ours."""
    pid = PIDS.get(url)
    if pid is None:
        return 0.0
    fields = Path(f"/proc/{pid}/task/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@dataclass
class Level:
    server: str
    clients: int
    ttft: list[float] = field(default_factory=list)
    latency: list[float] = field(default_factory=list)
    tokens: int = 0
    wall: float = 0.0
    errors: int = 0
    loop_cpu_s: float = 0.0  # the server's event-loop CPU over the round (ours only)
    tpot: list[float] = field(default_factory=list)  # per request: (end - first token) / (tokens - 1), ms

    @property
    def loop_ms_per_token(self) -> float:
        return 1e3 * self.loop_cpu_s / self.tokens if self.tokens else 0.0

    @property
    def tps(self) -> float:
        return self.tokens / self.wall if self.wall else 0.0


async def one(c: httpx.AsyncClient, body: dict[str, object], level: Level) -> None:
    """One streamed request. A keep-alive connection the server closed just before it was reused (llama-server
    closes them after a few requests) is retried once on a fresh connection, as HTTP clients do."""
    t0 = time.perf_counter()
    first: float | None = None
    chunks, usage = 0, None
    for attempt in (1, 2):
        try:
            async with c.stream("POST", ROUTE["path"], json=body) as r:
                if r.status_code != 200:
                    level.errors += 1
                    await r.aread()
                    return
                async for line in r.aiter_lines():
                    if not line.startswith("data: ") or line == "data: [DONE]":
                        continue
                    data = json.loads(line[6:])
                    if data.get("usage"):
                        usage = data["usage"]
                    choices = data.get("choices") or []
                    if choices and (choices[0].get("text") or (choices[0].get("delta") or {}).get("content")):
                        chunks += 1
                        if first is None:
                            first = time.perf_counter()
            break
        except httpx.RemoteProtocolError:
            if attempt == 2 or chunks:
                level.errors += 1
                return
    end = time.perf_counter()
    level.ttft.append(((first or end) - t0) * 1e3)
    level.latency.append((end - t0) * 1e3)
    n_tokens = int(usage["completion_tokens"]) if usage else chunks
    level.tokens += n_tokens
    if first is not None and n_tokens > 1:
        level.tpot.append((end - first) * 1e3 / (n_tokens - 1))


async def closed_loop(url: str, model: str, level: Level, bodies: list[dict[str, object]]) -> None:
    queue: asyncio.Queue[dict[str, object]] = asyncio.Queue()
    for b in bodies:
        queue.put_nowait({**b, "model": model})

    async def client(c: httpx.AsyncClient) -> None:
        while not queue.empty():
            await one(c, queue.get_nowait(), level)

    limits = httpx.Limits(max_connections=level.clients + 4)
    async with httpx.AsyncClient(base_url=url, timeout=600, limits=limits) as c:
        await one(c, {**body("Warm-up. Say hello.", 4), "model": model}, Level("warmup", 1))
        cpu0 = loop_cpu_s(url)
        t0 = time.perf_counter()
        await asyncio.gather(*(client(c) for _ in range(level.clients)))
        level.wall = time.perf_counter() - t0
        level.loop_cpu_s = loop_cpu_s(url) - cpu0


def body(p: str, max_tokens: int) -> dict[str, object]:
    text: dict[str, object] = (
        {"messages": [{"role": "user", "content": p}]} if ROUTE["path"].endswith("chat/completions") else {"prompt": p}
    )
    return {
        **text, "max_tokens": max_tokens, "temperature": 0.0, "logit_bias": BANNED_EOS, "stream": True,
        "stream_options": {"include_usage": True},
    }


@contextlib.contextmanager
def ours(
    slots: int, log: Path, *extra: str, src: str | None = None, env: dict[str, str] | None = None,
) -> Iterator[str]:
    """Our server; `src` runs another checkout's sources (`sluicegate-before`: $SLUICEGATE_BEFORE_SRC)."""
    port = free_port()
    own = [*(["--model", str(MODEL["gguf"])] if MODEL["gguf"] else []),
           *(["--chat-template-file", str(MODEL["template"])] if MODEL["template"] else [])]
    cmd = serve_command(port, "--slots", str(slots), "--threads", "2", "--ctx", str(CTX_PER_SLOT),
                        "--log-level", "warning", *own, *extra)
    if src is None:  # an older checkout may predate the store
        cmd += ["--data-dir", fresh_data_dir()]
    with launch(cmd, port, log=log, append=True, env={**(env or {}), **({"PYTHONPATH": src} if src else {})},
                group=True, timeout=300) as srv:
        PIDS[srv.url] = srv.pid
        yield srv.url
        PIDS.pop(srv.url, None)


@contextlib.contextmanager
def peer(slots: int, log: Path) -> Iterator[str]:
    from sluicegate.backends.llama_cpp import default_model_path

    port = free_port()
    exe = os.environ.get("LLAMA_SERVER", str(PEER / "llama-cpp-server"))
    template = ["--jinja", "--chat-template-file", str(MODEL["template"])] if MODEL["template"] else []
    cmd = [exe, "-m", str(MODEL["gguf"] or default_model_path()), "--host", "127.0.0.1", "--port", str(port),
           "--ctx-size", str(CTX_PER_SLOT * slots), "--", "-np", str(slots), "-t", "2", "--no-repack", *template]
    # a session of its own: llama-cpp-server is a wrapper whose child must go too
    with launch(cmd, port, ready="/health", log=log, append=True, env={}, group=True, timeout=300) as srv:
        yield srv.url


def model_of(url: str) -> str:
    with contextlib.suppress(Exception):
        return str(httpx.get(f"{url}/v1/models", timeout=10).json()["data"][0]["id"])
    return "default"


def cached_tokens(url: str) -> float:
    """Our server's prompt tokens reused from the prefix cache so far (/metrics)."""
    for line in httpx.get(f"{url}/metrics", timeout=10).text.splitlines():
        if line.startswith("sluicegate_cached_tokens"):
            return float(line.rpartition(" ")[2])
    return 0.0


def server(kind: str, slots: int, log: Path) -> contextlib.AbstractContextManager[str]:
    """`sluicegate` (as shipped), `sluicegate-plain` (--no-flash-attn), `llama-server`,
    `sluicegate-before` (the sources at $SLUICEGATE_BEFORE_SRC, e.g. a worktree of an older commit), or
    `sluicegate:ARGS` (as shipped with more `serve` arguments, space-separated: `sluicegate:--speculative-ngram=0`;
    a `NAME=VALUE` among them goes into the server's environment instead)."""
    if kind == "llama-server":
        return peer(slots, log)
    if kind == "sluicegate-before":
        return ours(slots, log, src=os.environ["SLUICEGATE_BEFORE_SRC"])
    if kind.startswith("sluicegate:"):
        args = kind.partition(":")[2].split()
        env = dict(a.split("=", 1) for a in args if not a.startswith("-"))
        return ours(slots, log, *[a for a in args if a.startswith("-")], env=env)
    return ours(slots, log, *(["--no-flash-attn"] if kind == "sluicegate-plain" else []))


def run_rounds(
    kinds: list[str], n: int, max_tokens: int, rounds: int, log: Path, per_round: int | None = None,
) -> dict[str, list[Level]]:
    """Every server up at once (an idle one takes no CPU), then `rounds` rounds of the closed loop, one server
    after the other, the starting server rotating: a slow spell of the machine hits every server alike.
    `per_round` requests a round (default `n_requests(n)`); at one client, 1 alternates the servers request by
    request, so the machine's drift over minutes cancels out of the per-round ratios."""
    out: dict[str, list[Level]] = {k: [] for k in kinds}
    per = per_round or n_requests(n)
    with contextlib.ExitStack() as stack:
        urls = {k: stack.enter_context(server(k, n, log)) for k in kinds}
        models = {k: model_of(u) for k, u in urls.items()}
        for r in range(rounds):
            bodies = [body(prompt(r * per + i, r), max_tokens) for i in range(per)]
            for kind in kinds[r % len(kinds):] + kinds[: r % len(kinds)]:
                lv = Level(kind, n)
                asyncio.run(closed_loop(urls[kind], models[kind], lv, bodies))
                out[kind].append(lv)
                print(f"{kind} x{n} round {r + 1}: {lv.tps:.1f} tok/s, TTFT p50 {percentile(lv.ttft, .5):.0f} ms p95 "
                      f"{percentile(lv.ttft, .95):.0f} ms, latency p50 {percentile(lv.latency, .5):.0f} ms, "
                      f"{percentile(lv.tpot, .5):.2f} ms/token, errors {lv.errors}, "
                      f"event loop {lv.loop_ms_per_token:.3f} ms CPU/token", flush=True)
    return out


def pooled(levels: list[Level]) -> Level:
    """Rounds merged: latencies pooled, tokens/s the median round's."""
    merged = Level(levels[0].server, levels[0].clients)
    for lv in levels:
        merged.ttft += lv.ttft
        merged.latency += lv.latency
        merged.errors += lv.errors
        merged.tpot += lv.tpot
    mid = sorted(levels, key=lambda lv: lv.tps)[len(levels) // 2]
    merged.tokens, merged.wall = mid.tokens, mid.wall
    merged.loop_cpu_s = mid.loop_cpu_s
    return merged


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--levels", default="1,4,8,16,32")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds per level (median reported)")
    ap.add_argument("--per-round", type=int, default=None,
                    help="requests per round (default max(3N, 12)); 1 at one client alternates request by request")
    ap.add_argument("--shared-level", type=int, default=8)
    ap.add_argument("--skip-shared", action="store_true")
    ap.add_argument("--servers", default="sluicegate,sluicegate-plain,llama-server")
    ap.add_argument("--json", type=Path, default=None, help="also write the raw numbers here")
    ap.add_argument("--log", type=Path, default=Path("/tmp/sluicegate-bench-servers.log"))
    ap.add_argument("--route", choices=("completions", "chat"), default="completions")
    ap.add_argument("--model", type=Path, default=None, help="another GGUF for both servers (default: SmolLM2)")
    ap.add_argument("--chat-template-file", type=Path, default=None, help="its chat template, for both servers")
    ap.add_argument("--banned-eos", default=None, help="its end-of-text token ids, comma-separated")
    args = ap.parse_args()
    MODEL["gguf"], MODEL["template"] = args.model, args.chat_template_file
    if args.banned_eos:
        BANNED_EOS.clear()
        BANNED_EOS.update({i.strip(): -100 for i in args.banned_eos.split(",")})
    ROUTE["path"] = "/v1/chat/completions" if args.route == "chat" else "/v1/completions"
    levels = [int(x) for x in args.levels.split(",")]
    kinds = args.servers.split(",")
    runs: dict[tuple[str, int], list[Level]] = {}
    for n in levels:
        for kind, lvs in run_rounds(kinds, n, args.max_tokens, args.rounds, args.log, args.per_round).items():
            runs[(kind, n)] = lvs
    print("\n| clients | server | tokens/s | ms per token (1 client) | TTFT p50 ms | TTFT p95 ms | latency p50 ms "
          "| latency p95 ms | event-loop CPU ms/token | ratio (per round) |\n|---|---|---|---|---|---|---|---|---|---|")
    for n in levels:
        peer_runs = runs.get(("llama-server", n))
        for kind in kinds:
            r = pooled(runs[(kind, n)])
            ratio = ""
            if kind != "llama-server" and peer_runs:
                per = sorted(a.tps / b.tps for a, b in zip(runs[(kind, n)], peer_runs, strict=True) if b.tps)
                ratio = f"{per[len(per) // 2]:.2f}x ({', '.join(f'{x:.2f}' for x in per)})"
            per_token = f"{percentile(r.tpot, .5):.2f}"
            loop = f"{r.loop_ms_per_token:.3f}" if r.loop_cpu_s else ""
            print(f"| {n} | {kind} | {r.tps:.1f} | {per_token} | {percentile(r.ttft, .5):.0f} | "
                  f"{percentile(r.ttft, .95):.0f} | "
                  f"{percentile(r.latency, .5):.0f} | {percentile(r.latency, .95):.0f} | {loop} | {ratio} |")
    shared_rows: list[tuple[str, Level, float]] = []
    if not args.skip_shared:
        n = args.shared_level
        qs = [f"Question {i}: tell me about {TOPICS[i % len(TOPICS)]}." for i in range(4 * n)]
        shared = [body(SYSTEM + q, args.max_tokens // 2) for q in qs]
        unique = [body(f"Session {i}. " + SYSTEM + q, args.max_tokens // 2) for i, q in enumerate(qs)]
        for kind, label, bodies in [(k, label, b) for k in kinds
                                    for label, b in (("shared", shared), ("unique", unique))]:
            lv = Level(kind, n)
            ours = kind != "llama-server"
            with server(kind, n, args.log) as url:
                before = cached_tokens(url) if ours else 0.0
                asyncio.run(closed_loop(url, model_of(url), lv, bodies))
                after = cached_tokens(url) if ours else 0.0
            shared_rows.append((label, lv, after - before))
            print(f"{kind} {label}: {lv.tps:.1f} tok/s, TTFT p50 {percentile(lv.ttft, .5):.0f} ms, "
                  f"cached tokens {after - before:.0f}", flush=True)
        print("\n| system prompt | server | tokens/s | TTFT p50 ms | TTFT p95 ms | latency p50 ms | "
              "prompt tokens reused |\n|---|---|---|---|---|---|---|")
        for label, lv, cached in shared_rows:
            reused = f"{cached:.0f}" if lv.server != "llama-server" else "n/a"
            print(f"| {label} | {lv.server} | {lv.tps:.1f} | {percentile(lv.ttft, .5):.0f} | "
                  f"{percentile(lv.ttft, .95):.0f} | {percentile(lv.latency, .5):.0f} | {reused} |")
    if args.json:
        raw = {
            "levels": [vars(lv) for lvs in runs.values() for lv in lvs],
            "shared": [{"label": label, **vars(lv), "cached": c} for label, lv, c in shared_rows],
        }
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(raw, indent=1))


if __name__ == "__main__":
    main()
