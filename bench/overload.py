"""Overload with deadlines: a burst as a fresh server's first traffic, one client alone, requests without a
timeout, and clients at twice the engine's capacity, each giving up after 10 s.

    flock /tmp/sluicegate-bench.lock .venv/bin/python bench/overload.py --write            # the full run
    ... bench/overload.py --slots 2 --max-tokens 8 --capacity-s 4 --phase-s 4 --timeout 5  # a smoke run
    ... bench/overload.py --reference 20 --slots 8 --max-tokens 32 --phase-s 30 --timeout 5  # no model: the
                                                       reference backend, 20 ms a step (checks the mechanism)

One server: the real model (`serve --slots S --threads 2`). Every request is the same shape: a non-streamed
`POST /v1/chat/completions`, greedy, end-of-text banned (logit_bias), so every answer is exactly
`--max-tokens` tokens; each prompt is distinct. The phases, each started on a drained engine:

0. before anything else (the server answered nothing yet; its forecast has only the calibration it measured
   while loading):
   - cold burst: `--burst` (40) requests at once, each with `X-Request-Timeout: --burst-timeout` (4);
   - a burst with no timeout: 16 concurrent `POST /v1/generate` of 40 new tokens sharing a 100-token prefix,
     no header (the server's `--max-timeout` bounds them): none may be refused;
   then, after the capacity phase, the same burst as the cold one again (warm burst): what a warmed server
   answers of it is the burst's capacity, against which the cold burst's goodput is measured (target: 80%);
1. capacity: 2S closed-loop clients for `--capacity-s` seconds, no deadline: answers per second with every
   slot busy and a queue waiting (with only S clients a slot would idle between a client's answer and its next
   request), over the steady state (after the first quarter). This also warms the engine's speed measurement
   (the forecast needs one);
2. deadlines: open-loop arrivals, evenly spaced, at `--factor` (2) x capacity for `--phase-s` seconds, each
   request sending `X-Request-Timeout: T` (`--timeout`, 10) and giving up after T seconds (it closes its
   connection, and the server aborts what it was doing for it);
3. the same arrivals without the header: the clients still give up after T seconds.

Phase 2 runs right after the warm burst (2x capacity after a burst). Then a second fresh server: one client,
`--single` (20) requests one after another, each with `X-Request-Timeout: --burst-timeout` (4) for an answer an
idle server gives in under a second: every one must be answered.

For every phase, the forecast's error: the median (and 10th-90th percentile) of forecast latency over actual
latency of the requests the engine ran to their end (`sluicegate_forecast_error_ratio`; 1 is exact; target:
the median within 20%).

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
import math
import os
import platform
import sys
import tempfile
import time
from collections.abc import Awaitable
from dataclasses import dataclass, field
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "src"))
from bench.common import sluicegate_server  # noqa: E402
from bench.report import median, percentile, publish  # noqa: E402
from sluicegate.api.routes.metrics import parse_metrics  # noqa: E402

HEADING = "## Overload: deadlines and load shedding"
BANNED_EOS = {"0": -100, "2": -100}  # <|endoftext|>, <|im_end|>
TOPICS = ["lighthouses", "bread", "the colour of the sky", "chess", "bicycles", "the water cycle", "coffee",
          "bird migration", "tides", "volcanoes", "bees", "paper"]
QUEUED, RUNNING = 'requests_expired_total{stage="queued"}', 'requests_expired_total{stage="running"}'
CANCELLED = 'requests_finished_total{finish_reason="cancelled"}'
COUNTERS = ("requests_shed_total", QUEUED, RUNNING, CANCELLED, "prompt_tokens_total",
            "generated_tokens_total", "requests_in_deadline_total", "goodput_tokens_total")
RATIO = "forecast_error_ratio_bucket"  # the forecast as of the last admission that changed it
ADMITTED = "admission_forecast_error_ratio_bucket"  # ... as of the request's own admission
PREFIX = ("You are a careful assistant. Answer briefly, cite no sources, and never invent facts. If a question is "
          "ambiguous, say which reading you answer. Prefer plain words to jargon. ") * 2  # ~100 tokens


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


GRACE_S = 1.0  # a client with a deadline waits this much past it for the server's own answer (504)
MODEL = {"name": "smollm2-135m-instruct"}  # the served model's name, read from /v1/models


def body(i: int, max_tokens: int) -> dict[str, object]:
    text = f"Request {i}. In a few sentences, tell me something surprising about {TOPICS[i % len(TOPICS)]}."
    return {"model": MODEL["name"], "messages": [{"role": "user", "content": text}],
            "max_tokens": max_tokens, "temperature": 0.0, "logit_bias": BANNED_EOS}


async def one(c: httpx.AsyncClient, i: int, args: argparse.Namespace, phase: Phase, header: bool,
              path: str = "/v1/chat/completions", payload: dict[str, object] | None = None) -> None:
    """One request; `args.timeout` is its header's budget (with `header`) and when its client gives up: with a
    header, `GRACE_S` later, so that an admitted request that overruns reaches the client as the server's 504
    (expired running) rather than hiding as a client that gave up at the same instant."""
    headers = {"X-Request-Timeout": format(args.timeout, "g")} if header else {}
    t0 = time.perf_counter()
    try:
        r = await asyncio.wait_for(c.post(path, json=payload or body(i, args.max_tokens), headers=headers),
                                   args.timeout + (GRACE_S if header else 0.0))
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
    ratio = {k[len("sluicegate_"):]: v for k, v in m.items()
             if k.startswith((f"sluicegate_{RATIO}", f"sluicegate_{ADMITTED}"))}
    return {**{k: m.get(f"sluicegate_{k}", 0.0) for k in (*COUNTERS, "running", "waiting")}, **ratio}


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


async def measured(c: httpx.AsyncClient, phase: Phase, work: Awaitable[None]) -> Phase:
    before = await drained(c)
    await work
    phase.counters = diff(await drained(c), before)
    return phase


async def run(url: str, args: argparse.Namespace) -> tuple[Phase, list[Phase], list[Phase]]:
    limits = httpx.Limits(max_connections=4096, max_keepalive_connections=512)
    async with httpx.AsyncClient(base_url=url, timeout=httpx.Timeout(None), limits=limits) as c:
        MODEL["name"] = (await c.get("/v1/models")).json()["data"][0]["id"]
        label = f"{args.burst} at once, X-Request-Timeout: {args.burst_timeout:g}"
        cold = Phase(f"cold burst (the first traffic): {label}")
        await measured(c, cold, burst(c, args, cold, first=2_000_000))
        untimed = Phase("16 at once, no timeout header (/v1/generate, 40 tokens, shared prefix)")
        await measured(c, untimed, untimed_burst(c, args, untimed))
        cap = Phase("capacity")
        await measured(c, cap, closed_loop(c, args, cap))
        warm = Phase(f"warm burst (after the capacity phase): {label}")
        await measured(c, warm, burst(c, args, warm, first=2_500_000))
        rate = args.factor * cap.goodput
        phases = [Phase(f"{args.factor:g}x capacity right after the warm burst, X-Request-Timeout: {args.timeout:g}"),
                  Phase(f"{args.factor:g}x capacity, no header (clients still give up after {args.timeout:g} s)")]
        for k, (p, header) in enumerate(zip(phases, (True, False), strict=True)):
            before = await drained(c)
            await open_loop(c, args, p, rate, header, first=(k + 1) * 1_000_000)
            p.counters = diff(await drained(c), before)
        return cap, phases, [cold, untimed, warm]


def diff(after: dict[str, float], before: dict[str, float]) -> dict[str, float]:
    return {k: after[k] - before.get(k, 0.0) for k in after if k in COUNTERS or k.startswith((RATIO, ADMITTED))}


def ratio_pct(counts: dict[str, float], q: float, name: str = RATIO) -> float:
    """The q-quantile of forecast / actual from the histogram `name`'s buckets (linear within a bucket)."""
    bounds = sorted((float(k.split('le="')[1].rstrip('"}')), v) for k, v in counts.items() if k.startswith(name))
    total = bounds[-1][1] if bounds else 0.0
    if not total:
        return float("nan")
    lo, below = 0.0, 0.0
    for le, cum in bounds:
        if cum >= q * total:
            if math.isinf(le):
                return lo
            return lo + (le - lo) * ((q * total - below) / (cum - below) if cum > below else 1.0)
        lo, below = le, cum
    return lo


def forecast_error(counts: dict[str, float]) -> str:
    n = max((v for k, v in counts.items() if k.startswith(RATIO)), default=0.0)
    if not n:
        return "-"
    return (f"{ratio_pct(counts, 0.5):.2f} ({ratio_pct(counts, 0.1):.2f}-{ratio_pct(counts, 0.9):.2f}; "
            f"{n:.0f} runs); at admission {ratio_pct(counts, 0.5, ADMITTED):.2f} "
            f"({ratio_pct(counts, 0.1, ADMITTED):.2f}-{ratio_pct(counts, 0.9, ADMITTED):.2f})")


async def burst(c: httpx.AsyncClient, args: argparse.Namespace, phase: Phase, first: int) -> None:
    """`--burst` chat requests at once, each with `--burst-timeout`."""
    tight = argparse.Namespace(**{**vars(args), "timeout": args.burst_timeout})
    phase.sent = args.burst
    await asyncio.gather(*(one(c, first + k, tight, phase, header=True) for k in range(args.burst)))


async def untimed_burst(c: httpx.AsyncClient, args: argparse.Namespace, phase: Phase) -> None:
    """16 concurrent /v1/generate, 40 new tokens, a shared 100-token prefix, no timeout sent."""
    wide = argparse.Namespace(**{**vars(args), "timeout": 600.0})
    phase.sent = 16
    await asyncio.gather(*(one(c, k, wide, phase, header=False, path="/v1/generate", payload={
        "prompt": f"{PREFIX}Question {k}: name a colour and say why you like it.", "max_new_tokens": 40,
        "temperature": 0.0}) for k in range(16)))


async def single(url: str, args: argparse.Namespace) -> Phase:
    """One client on a fresh server: `--single` requests in turn, each with `--burst-timeout`."""
    phase = Phase(f"one client, fresh server, X-Request-Timeout: {args.burst_timeout:g}")
    tight = argparse.Namespace(**{**vars(args), "timeout": args.burst_timeout})
    async with httpx.AsyncClient(base_url=url, timeout=httpx.Timeout(None)) as c:
        MODEL["name"] = (await c.get("/v1/models")).json()["data"][0]["id"]
        before = await drained(c)
        for k in range(args.single):
            phase.sent += 1
            await one(c, 3_000_000 + k, tight, phase, header=True)
        phase.counters = diff(await drained(c), before)
    return phase


def burst_row(p: Phase) -> str:
    k = p.counters
    refused = (f"{len(p.refused)} ({percentile(p.refused, 0.5):.0f} / {percentile(p.refused, 0.99):.0f} ms)"
               if p.refused else "0")
    return (f"| {p.name} | {p.sent} | {p.in_time} ({median(p.latency) if p.latency else 0:.0f} / "
            f"{percentile(p.latency, 1.0) if p.latency else 0:.0f} ms) | {refused} | {p.expired} | {p.gave_up} "
            f"| {k[QUEUED]:.0f} | **{k[RUNNING]:.0f}** | {forecast_error(k)} "
            f"| {', '.join(f'{n} x {st}' for st, n in sorted(p.other.items())) or '-'} |")


def report(args: argparse.Namespace, cap: Phase, phases: list[Phase], bursts: list[Phase], alone: Phase,
           started: str, load0: float) -> str:
    flags = " ".join(f"--{k.replace('_', '-')} {v:g}" for k, v in (
        ("slots", args.slots), ("max_tokens", args.max_tokens), ("capacity_s", args.capacity_s),
        ("phase_s", args.phase_s), ("timeout", args.timeout), ("factor", args.factor), ("burst", args.burst),
        ("burst_timeout", args.burst_timeout), ("single", args.single))
        if v != DEFAULTS[k])
    rows = []
    for p in phases:
        k = p.counters
        computed = k["prompt_tokens_total"] + k["generated_tokens_total"]
        wasted = max(0.0, computed - p.in_time_tokens)
        refused = (f"{len(p.refused)} ({percentile(p.refused, 0.5):.1f} / {percentile(p.refused, 0.99):.1f} ms; "
                   f"Retry-After {min(p.retry_after)}-{max(p.retry_after)} s)" if p.refused else "0")
        rows.append(
            f"| {p.name} | {p.sent / p.wall_s:.2f} | {p.sent} | {p.in_time} "
            f"({median(p.latency) if p.latency else 0:.0f} ms) | {p.goodput:.2f} "
            f"| **{100 * p.goodput / cap.goodput:.0f}%** | {refused} | {p.expired} | {p.gave_up} "
            f"| {k['requests_shed_total']:.0f} | {k[QUEUED]:.0f} "
            f"| **{k[RUNNING]:.0f}** | {k[CANCELLED]:.0f} "
            f"| {computed:.0f} | {wasted:.0f} ({100 * wasted / computed if computed else 0:.0f}%) "
            f"| {forecast_error(k)} | {', '.join(f'{n} x {st}' for st, n in sorted(p.other.items())) or '-'} |")
    target = phases[0].goodput / cap.goodput if cap.goodput else 0.0
    cold, untimed, warm = bursts
    cold_share = cold.in_time / warm.in_time if warm.in_time else 0.0
    refused_untimed = len(untimed.refused) + sum(n for st, n in untimed.other.items() if st.startswith("4"))
    running = sum(p.counters[RUNNING] for p in (*phases, *bursts, alone))
    timed = [p for p in (*bursts, alone, cap, phases[0]) if not math.isnan(ratio_pct(p.counters, 0.5))]
    worst = max(timed, key=lambda p: abs(math.log(ratio_pct(p.counters, 0.5))), default=None)
    worst_at = max(timed, key=lambda p: abs(math.log(ratio_pct(p.counters, 0.5, ADMITTED))), default=None)
    checks = [
        f"one client alone: {alone.in_time} of {alone.sent} answered in time (target: all, "
        f"{'met' if alone.in_time == alone.sent else 'missed'})",
        f"no timeout header: {refused_untimed} of {untimed.sent} refused (target: none, "
        f"{'met' if not refused_untimed else 'missed'})",
        f"cold burst: {cold.in_time} answered in time, {100 * cold_share:.0f}% of the warm burst's {warm.in_time} "
        f"(target: at least 80%, {'met' if cold_share >= 0.8 else 'missed'})",
        f"warm 2x overload: goodput {100 * target:.0f}% of capacity (target: at least 90%, "
        f"{'met' if target >= 0.9 else 'missed'})",
        f"admitted and expired while running, every phase together: {running:.0f} (target: none, "
        f"{'met' if not running else 'missed'})",
    ]
    if worst is not None and worst_at is not None:
        far, far_at = ratio_pct(worst.counters, 0.5), ratio_pct(worst_at.counters, 0.5, ADMITTED)
        checks.append(f"forecast / actual, the median furthest from 1 of the timed phases and capacity: {far:.2f} "
                      f"({worst.name}; target: within 20%, {'met' if abs(far - 1) <= 0.2 else 'missed'}), at "
                      f"admission {far_at:.2f} ({worst_at.name}; {'met' if abs(far_at - 1) <= 0.2 else 'missed'})")
    return "\n".join([
        HEADING, "",
        f"Command: `.venv/bin/python bench/overload.py{' ' + flags if flags else ''}"
        f"{' --write' if args.write else ''}`, under an exclusive lock (no other benchmark at the same time) "
        f"({started}, load average {load0:.1f} at the start, {os.getloadavg()[0]:.1f} at the end: other work "
        f"shared the machine where that is above ~1). Machine: {platform.machine()}, {os.cpu_count()} cores, "
        f"Python {platform.python_version()}. bench/overload.py describes the phases. "
        "Forecast / actual: the median (10th-90th percentile) of `sluicegate_forecast_error_ratio` over the "
        "phase's runs (each request's forecast as of the last admission that changed it: the forecast admission "
        "keeps inside its deadline), and the median (10th-90th) of `sluicegate_admission_forecast_error_ratio` "
        "(as it was admitted: the requests admitted after it, which it had to foresee, included); 1 is exact, "
        "above 1 the forecast was pessimistic.",
        "",
        f"Bursts and a lone client, {args.max_tokens} new tokens each (chat; the untimed burst: /v1/generate, 40):",
        "",
        "| workload | sent | answered in time (median / max latency) | refused 503 (p50 / p99 latency) | 504 "
        "| client gave up | expired queued | expired running | forecast / actual | other |",
        "|---|---|---|---|---|---|---|---|---|---|",
        *(burst_row(p) for p in (cold, untimed, warm, alone)), "",
        f"Capacity: {2 * args.slots} closed-loop clients on {args.slots} slots, non-streamed chat, exactly "
        f"{args.max_tokens} new tokens each: **{cap.goodput:.2f} answers/s** (answers arriving after the first "
        f"quarter of {args.capacity_s:g} s; median latency {median(cap.latency) if cap.latency else 0:.0f} ms; "
        f"forecast / actual {forecast_error(cap.counters)}). Then open-loop arrivals at {args.factor:g}x that rate "
        f"for {args.phase_s:g} s, each client giving up after {args.timeout:g} s:",
        "",
        "| workload | offered req/s | sent | answered in time (median latency) | goodput req/s | goodput / capacity "
        "| refused 503 (latency p50 / p99) | 504 | client gave up | engine: shed | expired queued "
        "| expired running | cancelled (client left) | tokens computed | of which for nobody | forecast / actual "
        "| other |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
        *rows, "",
        "Targets: " + "; ".join(checks) + ". Tokens computed = prompt tokens computed (cache hits excluded) "
        "plus tokens generated, from the engine's counters; \"for nobody\" = those not in an answer its client "
        "received in time (the shared chat-template prefix is served from the prefix cache, so it is not counted).",
        "",
    ])


DEFAULTS = {"slots": 16, "max_tokens": 64, "capacity_s": 60.0, "phase_s": 120.0, "timeout": 10.0, "factor": 2.0,
            "burst": 40, "burst_timeout": 4.0, "single": 20}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--slots", type=int, default=DEFAULTS["slots"])
    ap.add_argument("--max-tokens", type=int, default=DEFAULTS["max_tokens"])
    ap.add_argument("--capacity-s", type=float, default=DEFAULTS["capacity_s"])
    ap.add_argument("--phase-s", type=float, default=DEFAULTS["phase_s"])
    ap.add_argument("--timeout", type=float, default=DEFAULTS["timeout"], help="each client's budget, seconds")
    ap.add_argument("--factor", type=float, default=DEFAULTS["factor"], help="arrival rate / capacity")
    ap.add_argument("--burst", type=int, default=DEFAULTS["burst"], help="requests in the cold and warm bursts")
    ap.add_argument("--burst-timeout", type=float, default=DEFAULTS["burst_timeout"],
                    help="the bursts' and the lone client's budget, seconds")
    ap.add_argument("--single", type=int, default=DEFAULTS["single"], help="the lone client's requests")
    ap.add_argument("--reference", type=float, default=None, metavar="STEP_MS",
                    help="instead of the real model, the reference backend with every step taking STEP_MS: a check "
                         "of the mechanism (the printout is not for docs/benchmarks.md)")
    ap.add_argument("--write", action="store_true", help="replace the section in docs/benchmarks.md")
    args = ap.parse_args()
    if args.reference is not None and args.write:
        raise SystemExit("--reference runs are not benchmarks of the model: no --write")
    started, load0 = time.strftime("%Y-%m-%d %H:%M"), os.getloadavg()[0]
    def server(stack: contextlib.ExitStack) -> str:
        if args.reference is None:
            return stack.enter_context(
                sluicegate_server("--slots", str(args.slots), "--threads", "2", "--log-level", "warning"))
        from sluicegate.testing.refserver import running

        logs = stack.enter_context(tempfile.TemporaryDirectory())
        return stack.enter_context(running(Path(logs), "--slots", str(args.slots), "--ctx", "512", "--eos-slope",
                                           "0", "--step-delay-ms", format(args.reference, "g"))).url

    with contextlib.ExitStack() as stack:
        cap, phases, bursts = asyncio.run(run(server(stack), args))
    with contextlib.ExitStack() as stack:
        alone = asyncio.run(single(server(stack), args))
    text = report(args, cap, phases, bursts, alone, started, load0)
    publish(HEADING, text, args.write)


if __name__ == "__main__":
    main()
