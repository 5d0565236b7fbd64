"""Batch jobs on the real model: interactive TTFT while a large job runs, and the job's tokens/s.

    flock /tmp/sluicegate-bench.lock .venv/bin/python bench/jobs.py --write            # the full run
    ... bench/jobs.py --items 4 --probes 3 --rounds 1 --max-tokens 8                   # a smoke run

One server (`sluicegate serve`, the default model, `--slots` slots, the batch worker at `--worker-slots`,
default a quarter of them), and per round, in this order:

1. **idle TTFT**: `--probes` interactive streaming `/v1/completions` requests, one at a time (a pause between
   them), TTFT = send -> first streamed token, measured on the client;
2. **engine alone**: the job's `--items` requests sent directly as non-streaming `/v1/completions`, closed
   loop with as many clients as the worker has slots (the concurrency the job runs at): generated tokens /
   wall time. This is the engine doing the job's work without the job system;
3. **job alone**: the same requests as one `/v1/batches` job (uploaded through `/v1/files`), polled every
   0.2 s: generated tokens (from the output file) / (time the job was seen completed - time it was created);
4. **TTFT under the job**: the same job again, and while it runs the interactive probes of step 1.

Every request generates exactly `--max-tokens` tokens (end-of-text banned by logit_bias) from a prompt of its
own (no shared prefix). Targets: TTFT p95 under the job within 1.5x idle; the job's tokens/s at least 0.9x the
engine alone. Ratios are the medians of the per-round ratios. `--write` replaces the "## Batch jobs" section
of docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import sys
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.common import sluicegate_server
from bench.report import median, percentile, publish

HEADING = "## Batch jobs"
BANNED_EOS = {"0": -100, "2": -100}  # <|endoftext|>, <|im_end|>


def body(i: int, tag: str, max_tokens: int) -> dict[str, object]:
    return {"model": "smollm2-135m-instruct", "prompt": f"[{tag} {i}] Write a short note about the number {i}.",
            "max_tokens": max_tokens,
            "temperature": 0, "logit_bias": BANNED_EOS}


async def ttft(c: httpx.AsyncClient, i: int, tag: str, max_tokens: int) -> float:
    t = time.perf_counter()
    async with c.stream("POST", "/v1/completions", json={**body(i, tag, max_tokens), "stream": True}) as r:
        async for line in r.aiter_lines():
            if line.startswith("data: ") and '"text"' in line:
                return time.perf_counter() - t
    raise RuntimeError(f"the stream ended without a token (HTTP {r.status_code})")


async def probes(c: httpx.AsyncClient, n: int, tag: str, max_tokens: int,
                 stop: asyncio.Event | None = None) -> list[float]:
    out: list[float] = []
    for i in range(n):
        if stop is not None and stop.is_set():
            break
        out.append(await ttft(c, i, tag, max_tokens))
        await asyncio.sleep(0.2)
    return out


async def engine_alone(c: httpx.AsyncClient, items: int, clients: int, tag: str, max_tokens: int) -> float:
    queue = list(range(items))
    tokens = 0

    async def client() -> None:
        nonlocal tokens
        while queue:
            r = await c.post("/v1/completions", json=body(queue.pop(), tag, max_tokens))
            r.raise_for_status()
            tokens += r.json()["usage"]["completion_tokens"]

    t = time.perf_counter()
    await asyncio.gather(*(client() for _ in range(clients)))
    return tokens / (time.perf_counter() - t)


async def run_job(c: httpx.AsyncClient, items: int, tag: str, max_tokens: int, done: asyncio.Event) -> float:
    lines = [{"custom_id": f"{tag}-{i}", "method": "POST", "url": "/v1/completions", "body": body(i, tag, max_tokens)}
             for i in range(items)]
    data = b"".join(json.dumps(x).encode() + b"\n" for x in lines)
    f = (await c.post("/v1/files", files={"file": ("b.jsonl", io.BytesIO(data))}, data={"purpose": "batch"})).json()
    t = time.perf_counter()
    b = (await c.post("/v1/batches", json={"input_file_id": f["id"], "endpoint": "/v1/completions",
                                           "completion_window": "24h"})).json()
    while b["status"] not in ("completed", "failed", "cancelled", "expired"):
        await asyncio.sleep(0.2)
        b = (await c.get(f"/v1/batches/{b['id']}")).json()
    wall = time.perf_counter() - t
    done.set()
    if b["status"] != "completed" or not b["output_file_id"]:
        raise RuntimeError(f"the job ended {b['status']}")
    out = (await c.get(f"/v1/files/{b['output_file_id']}/content")).text.splitlines()
    tokens = sum(json.loads(x)["response"]["body"]["usage"]["completion_tokens"] for x in out)
    return tokens / wall


async def round_(url: str, args: argparse.Namespace, r: int) -> dict[str, float]:
    async with httpx.AsyncClient(base_url=url, timeout=600) as c:
        idle = await probes(c, args.probes, f"idle{r}", args.probe_tokens)
        alone = await engine_alone(c, args.items, args.worker_slots, f"engine{r}", args.max_tokens)
        job = await run_job(c, args.items, f"job{r}", args.max_tokens, asyncio.Event())
        done = asyncio.Event()
        task = asyncio.create_task(run_job(c, args.items, f"busy{r}", args.max_tokens, done))
        await asyncio.sleep(2.0)  # the worker has leased its items
        busy = await probes(c, args.probes, f"under{r}", args.probe_tokens, done)
        await task
    if len(busy) < max(3, args.probes // 2):
        print(f"round {r}: only {len(busy)} probes ran during the job; use more --items", file=sys.stderr)
    return {"idle_p95": percentile(idle, 0.95), "busy_p95": percentile(busy, 0.95), "engine_tps": alone, "job_tps": job}


def report(rows: list[dict[str, float]], args: argparse.Namespace) -> str:
    ttft_ratio = median([x["busy_p95"] / x["idle_p95"] for x in rows])
    tps_ratio = median([x["job_tps"] / x["engine_tps"] for x in rows])
    lines = [HEADING, "", f"`.venv/bin/python bench/jobs.py --items {args.items} --probes {args.probes} --rounds "
             f"{args.rounds} --max-tokens {args.max_tokens} --probe-tokens {args.probe_tokens} --slots {args.slots} "
             f"--worker-slots {args.worker_slots}"
             f"`: {args.items} requests of {args.max_tokens} tokens as one `/v1/batches` job on the default model "
             f"({args.slots} slots, the worker at {args.worker_slots}); interactive probes of {args.probe_tokens} "
             "tokens, streamed. Method in the script's docstring.", "",
             "| round | TTFT p95 idle (ms) | TTFT p95 under the job (ms) | engine alone (tok/s) | job (tok/s) |",
             "| ---: | ---: | ---: | ---: | ---: |"]
    for i, x in enumerate(rows, 1):
        lines.append(f"| {i} | {x['idle_p95'] * 1e3:.0f} | {x['busy_p95'] * 1e3:.0f} | {x['engine_tps']:.1f} | "
                     f"{x['job_tps']:.1f} |")
    lines += ["", f"TTFT p95 under the job / idle: **{ttft_ratio:.2f}x** (target within 1.5x: "
              f"{'met' if ttft_ratio <= 1.5 else 'missed'}); the job's tokens/s / the engine alone: "
              f"**{tps_ratio:.2f}x** (target at least 0.9x: {'met' if tps_ratio >= 0.9 else 'missed'})."]
    return "\n".join(lines) + "\n"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--items", type=int, default=64)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--probes", type=int, default=20)
    p.add_argument("--probe-tokens", type=int, default=16)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--slots", type=int, default=8)
    p.add_argument("--worker-slots", type=int, default=None, help="default: a quarter of the slots (the server's)")
    p.add_argument("--write", action="store_true")
    args = p.parse_args()
    args.worker_slots = args.worker_slots or max(1, args.slots // 4)
    with sluicegate_server("--slots", str(args.slots), "--batch-worker-slots", str(args.worker_slots),
                           "--batch-poll-seconds", "0.1") as url:
        rows = [asyncio.run(round_(url, args, r)) for r in range(args.rounds)]
    text = report(rows, args)
    publish(HEADING, text, args.write)
    return 0


if __name__ == "__main__":
    sys.exit(main())
