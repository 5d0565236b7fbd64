"""Overload with deadlines: clients at twice the engine's capacity, each giving up after 10 s.

    flock /tmp/sluicegate-bench.lock .venv/bin/python bench/overload.py --write            # the full run
    ... bench/overload.py --slots 2 --max-tokens 8 --capacity-s 4 --phase-s 4 --timeout 5  # a smoke run
    ... bench/overload.py --reference 20 --slots 8 --max-tokens 32 --phase-s 30 --timeout 5  # no model: the
                                                       reference backend, 20 ms a step (checks the mechanism)

One server: the real model (`serve --slots S --threads 2`). Every request is the same shape: a non-streamed
`POST /v1/chat/completions`, greedy, end-of-text banned (logit_bias), so every answer is exactly
`--max-tokens` tokens; each prompt is distinct. Three phases, each started on a drained engine:

1. capacity: 2S closed-loop clients for `--capacity-s` seconds, no deadline: answers per second with every
   slot busy and a queue waiting (with only S clients a slot would idle between a client's answer and its next
   request), over the steady state (after the first quarter). This also warms the engine's speed measurement
   (the forecast needs one);
2. deadlines: open-loop arrivals, evenly spaced, at `--factor` (2) x capacity for `--phase-s` seconds, each
   request sending `X-Request-Timeout: T` (`--timeout`, 10) and giving up after T seconds (it closes its
   connection, and the server aborts what it was doing for it);
3. the same arrivals without the header: the clients still give up after T seconds.

Measured on the client: each answer's status and latency, each refusal's latency and Retry-After. Goodput =
answers (200) received within T of sending, per second of arrivals, against the capacity (target: at least
90%). From the engine's counters (/metrics, before and after each phase): requests shed by the forecast,
expired while queued (no compute) or running, and the tokens computed (prompt tokens computed plus tokens
generated) against those that went into answers received in time: the rest is compute spent on callers who
gave up. Prints the markdown for docs/benchmarks.md; `--write` replaces its section there.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import platform
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "src"))
from bench.common import median, sluicegate_server, write_section  # noqa: E402
from sluicegate.api.routes.metrics import parse_metrics  # noqa: E402

HEADING = "## Overload: deadlines and load shedding"
BANNED_EOS = {"0": -100, "2": -100}  # <|endoftext|>, <|im_end|>
TOPICS = ["lighthouses", "bread", "the colour of the sky", "chess", "bicycles", "the water cycle", "coffee",
          "bird migration", "tides", "volcanoes", "bees", "paper"]
QUEUED, RUNNING = 'requests_expired_total{stage="queued"}', 'requests_expired_total{stage="running"}'
CANCELLED = 'requests_finished_total{finish_reason="cancelled"}'
COUNTERS = ("requests_shed_total", QUEUED, RUNNING, CANCELLED, "prompt_tokens_total",
            "generated_tokens_total", "requests_in_deadline_total", "goodput_tokens_total")


@dataclass
class Phase:
    name: str
    sent: int = 0
    wall_s: float = 0.0  # the arrivals' span (closed loop: the phase's length)
    in_time: int = 0  # 200 within the timeout
    in_time_tokens: int = 0  # prompt tokens computed (not cached) + completion tokens of those
    latency: list[float] = field(default_factory=list)  # ms, answers in time
    done_at: list[float] = field(default_factory=list)  # perf_counter when each answer in time arrived
    rate: float = 0.0  # closed loop: answers per second in the steady window (set by closed_loop)
    late: int = 0  # 200, but after the client would have given up (closed loop only: it never gives up)
    gave_up: int = 0  # the client's timeout passed first
    refused: list[float] = field(default_factory=list)  # 503 latencies, ms
    retry_after: list[int] = field(default_factory=list)
    expired: int = 0  # 504 deadline_exceeded
    other: dict[str, int] = field(default_factory=dict)  # "status type" -> count
    counters: dict[str, float] = field(default_factory=dict)  # engine counters' change over the phase

    @property
    def goodput(self) -> float:
        if self.rate:
            return self.rate
        return self.in_time / self.wall_s if self.wall_s else 0.0


MODEL = {"name": "smollm2-135m-instruct"}  # the served model's name, read from /v1/models


def body(i: int, max_tokens: int) -> dict[str, object]:
    text = f"Request {i}. In a few sentences, tell me something surprising about {TOPICS[i % len(TOPICS)]}."
    return {"model": MODEL["name"], "messages": [{"role": "user", "content": text}],
            "max_tokens": max_tokens, "temperature": 0.0, "logit_bias": BANNED_EOS}


async def one(c: httpx.AsyncClient, i: int, args: argparse.Namespace, phase: Phase, header: bool) -> None:
    headers = {"X-Request-Timeout": format(args.timeout, "g")} if header else {}
    t0 = time.perf_counter()
    try:
        r = await asyncio.wait_for(c.post("/v1/chat/completions", json=body(i, args.max_tokens), headers=headers),
                                   args.timeout)
    except TimeoutError:
        phase.gave_up += 1
        return
    ms = (time.perf_counter() - t0) * 1e3
    if r.status_code == 200:
        u = r.json()["usage"]
        cached = (u.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
        if ms <= args.timeout * 1e3:
            phase.in_time += 1
            phase.latency.append(ms)
            phase.done_at.append(time.perf_counter())
            phase.in_time_tokens += u["prompt_tokens"] - cached + u["completion_tokens"]
        else:
            phase.late += 1
    elif r.status_code == 503:
        phase.refused.append(ms)
        phase.retry_after.append(int(r.headers.get("retry-after", "0")))
    elif r.status_code == 504:
        phase.expired += 1
    else:
        try:
            kind = f"{r.status_code} {r.json()['error'].get('code') or r.json()['error']['type']}"
        except (ValueError, KeyError, TypeError):
            kind = str(r.status_code)
        phase.other[kind] = phase.other.get(kind, 0) + 1


async def counters(c: httpx.AsyncClient) -> dict[str, float]:
    m = parse_metrics((await c.get("/metrics")).text)
    return {k: m.get(f"sluicegate_{k}", 0.0) for k in (*COUNTERS, "running", "waiting")}


async def drained(c: httpx.AsyncClient) -> dict[str, float]:
    """The counters once the engine is empty and they have stopped moving (aborts of clients that just gave
    up reach the engine a moment after they leave)."""
    last: dict[str, float] = {}
    while True:
        now = await counters(c)
        if now["running"] == 0 and now["waiting"] == 0 and now == last:
            return now
        last = now
        await asyncio.sleep(0.5)


async def closed_loop(c: httpx.AsyncClient, args: argparse.Namespace, phase: Phase) -> None:
    end = time.perf_counter() + args.capacity_s
    t0 = time.perf_counter()
    wide = argparse.Namespace(**{**vars(args), "timeout": 600.0})  # capacity: nobody gives up

    clients = 2 * args.slots

    async def client(k: int) -> None:
        i = k
        while time.perf_counter() < end:
            phase.sent += 1
            await one(c, 100_000 + i, wide, phase, header=False)
            i += clients
    await asyncio.gather(*(client(k) for k in range(clients)))
    phase.wall_s = time.perf_counter() - t0
    # the steady state: answers that arrived after the first quarter (the slots filling up together) and
    # before the end (the last requests finishing with fewer and fewer in flight)
    start = t0 + args.capacity_s / 4
    phase.rate = sum(start <= t <= end for t in phase.done_at) / (end - start)
    if phase.rate == 0:  # too short a phase for a steady state (a smoke run): the whole phase's
        phase.rate = phase.in_time / phase.wall_s
    if phase.rate == 0:
        raise SystemExit("no answer in the capacity phase: give it longer (--capacity-s)")


async def open_loop(c: httpx.AsyncClient, args: argparse.Namespace, phase: Phase, rate: float, header: bool,
                    first: int) -> None:
    n = max(1, round(rate * args.phase_s))
    t0 = time.perf_counter()
    tasks = []
    for k in range(n):
        await asyncio.sleep(max(0.0, t0 + k / rate - time.perf_counter()))
        tasks.append(asyncio.create_task(one(c, first + k, args, phase, header)))
        phase.sent += 1
    phase.wall_s = n / rate
    await asyncio.gather(*tasks)


async def run(url: str, args: argparse.Namespace) -> tuple[Phase, list[Phase]]:
    limits = httpx.Limits(max_connections=4096, max_keepalive_connections=512)
    async with httpx.AsyncClient(base_url=url, timeout=httpx.Timeout(None), limits=limits) as c:
        MODEL["name"] = (await c.get("/v1/models")).json()["data"][0]["id"]
        await one(c, 0, argparse.Namespace(**{**vars(args), "timeout": 600.0}), Phase("warm-up"), header=False)
        cap = Phase("capacity")
        before = await drained(c)
        await closed_loop(c, args, cap)
        cap.counters = diff(await drained(c), before)
        rate = args.factor * cap.goodput
        phases = [Phase(f"{args.factor:g}x capacity, X-Request-Timeout: {args.timeout:g}"),
                  Phase(f"{args.factor:g}x capacity, no header (clients still give up after {args.timeout:g} s)")]
        for k, (p, header) in enumerate(zip(phases, (True, False), strict=True)):
            before = await drained(c)
            await open_loop(c, args, p, rate, header, first=(k + 1) * 1_000_000)
            p.counters = diff(await drained(c), before)
        return cap, phases


def diff(after: dict[str, float], before: dict[str, float]) -> dict[str, float]:
    return {k: after[k] - before.get(k, 0.0) for k in COUNTERS}


def pct(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, round(q * (len(s) - 1)))] if s else float("nan")


def report(args: argparse.Namespace, cap: Phase, phases: list[Phase], started: str, load0: float) -> str:
    flags = " ".join(f"--{k.replace('_', '-')} {v:g}" for k, v in (
        ("slots", args.slots), ("max_tokens", args.max_tokens), ("capacity_s", args.capacity_s),
        ("phase_s", args.phase_s), ("timeout", args.timeout), ("factor", args.factor))
        if v != DEFAULTS[k])
    rows = []
    for p in phases:
        k = p.counters
        computed = k["prompt_tokens_total"] + k["generated_tokens_total"]
        wasted = max(0.0, computed - p.in_time_tokens)
        refused = (f"{len(p.refused)} ({pct(p.refused, 0.5):.1f} / {pct(p.refused, 0.99):.1f} ms; "
                   f"Retry-After {min(p.retry_after)}-{max(p.retry_after)} s)" if p.refused else "0")
        rows.append(
            f"| {p.name} | {p.sent / p.wall_s:.2f} | {p.sent} | {p.in_time} "
            f"({median(p.latency) if p.latency else 0:.0f} ms) | {p.goodput:.2f} "
            f"| **{100 * p.goodput / cap.goodput:.0f}%** | {refused} | {p.expired} | {p.gave_up} "
            f"| {k['requests_shed_total']:.0f} | {k[QUEUED]:.0f} "
            f"| {k[RUNNING]:.0f} | {k[CANCELLED]:.0f} "
            f"| {computed:.0f} | {wasted:.0f} ({100 * wasted / computed if computed else 0:.0f}%) "
            f"| {', '.join(f'{n} x {st}' for st, n in sorted(p.other.items())) or '-'} |")
    target = phases[0].goodput / cap.goodput if cap.goodput else 0.0
    return "\n".join([
        HEADING, "",
        f"Command: `flock /tmp/sluicegate-bench.lock .venv/bin/python bench/overload.py{' ' + flags if flags else ''}"
        f"{' --write' if args.write else ''}` ({started}, load average {load0:.1f} at the start, "
        f"{os.getloadavg()[0]:.1f} at the end). Machine: {platform.machine()}, {os.cpu_count()} cores, "
        f"Python {platform.python_version()}. bench/overload.py describes the phases.",
        "",
        f"Capacity: {2 * args.slots} closed-loop clients on {args.slots} slots, non-streamed chat, exactly "
        f"{args.max_tokens} new tokens each: **{cap.goodput:.2f} answers/s** (answers arriving after the first "
        f"quarter of {args.capacity_s:g} s; median latency {median(cap.latency) if cap.latency else 0:.0f} ms). Then "
        f"open-loop arrivals at {args.factor:g}x that rate for {args.phase_s:g} s, each client giving up after "
        f"{args.timeout:g} s:",
        "",
        "| workload | offered req/s | sent | answered in time (median latency) | goodput req/s | goodput / capacity "
        "| refused 503 (latency p50 / p99) | 504 | client gave up | engine: shed | expired queued "
        "| expired running | cancelled (client left) | tokens computed | of which for nobody | other |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
        *rows, "",
        f"Goodput with deadlines: {100 * target:.0f}% of capacity (target: at least 90%, "
        f"{'met' if target >= 0.9 else 'missed'}). Tokens computed = prompt tokens computed (cache hits excluded) "
        "plus tokens generated, from the engine's counters; \"for nobody\" = those not in an answer its client "
        "received in time (the shared chat-template prefix is served from the prefix cache, so it is not counted).",
        "",
    ])


DEFAULTS = {"slots": 16, "max_tokens": 64, "capacity_s": 60.0, "phase_s": 120.0, "timeout": 10.0, "factor": 2.0}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--slots", type=int, default=DEFAULTS["slots"])
    ap.add_argument("--max-tokens", type=int, default=DEFAULTS["max_tokens"])
    ap.add_argument("--capacity-s", type=float, default=DEFAULTS["capacity_s"])
    ap.add_argument("--phase-s", type=float, default=DEFAULTS["phase_s"])
    ap.add_argument("--timeout", type=float, default=DEFAULTS["timeout"], help="each client's budget, seconds")
    ap.add_argument("--factor", type=float, default=DEFAULTS["factor"], help="arrival rate / capacity")
    ap.add_argument("--reference", type=float, default=None, metavar="STEP_MS",
                    help="instead of the real model, the reference backend with every step taking STEP_MS: a check "
                         "of the mechanism (the printout is not for docs/benchmarks.md)")
    ap.add_argument("--write", action="store_true", help="replace the section in docs/benchmarks.md")
    args = ap.parse_args()
    if args.reference is not None and args.write:
        raise SystemExit("--reference runs are not benchmarks of the model: no --write")
    started, load0 = time.strftime("%Y-%m-%d %H:%M"), os.getloadavg()[0]
    with contextlib.ExitStack() as stack:
        if args.reference is None:
            url = stack.enter_context(
                sluicegate_server("--slots", str(args.slots), "--threads", "2", "--log-level", "warning"))
        else:
            from sluicegate.testing.refserver import running

            logs = stack.enter_context(tempfile.TemporaryDirectory())
            url = stack.enter_context(running(Path(logs), "--slots", str(args.slots), "--ctx", "512", "--eos-slope",
                                              "0", "--step-delay-ms", format(args.reference, "g"))).url
        cap, phases = asyncio.run(run(url, args))
    text = report(args, cap, phases, started, load0)
    print(text)
    if args.write:
        write_section(HEADING, text)


if __name__ == "__main__":
    main()
