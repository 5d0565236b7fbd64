"""Replicas behind HAProxy, as deploy/ ships them, run as processes on 127.0.0.1 (sluicegate.testing.cluster):
three replicas on one Postgres database and one Redis, deploy/haproxy.cfg in front, TLS with a certificate made
for the run.

    flock /work/helpers/bench.lock .venv/bin/python bench/cluster.py --write               # every scenario
    .venv/bin/python bench/cluster.py --scenario restart --duration 20                     # one, shorter

Scenarios (each on a fresh database):

- **restart**: `--clients` clients send chat completions through HAProxy without a pause, with the official
  `openai` client and its default retries (2, on connection errors, 408, 409, 429 and 5xx, honouring
  Retry-After); meanwhile every replica is restarted in turn (SIGTERM: the drain; a new process; back in
  HAProxy's rotation before the next). Counts: calls, calls that failed after the client's retries, retries.
- **kill**: a 300-item `/v1/batches` job through HAProxy; once a third is done one replica is killed with
  `kill -9` and started again. Counts from the store: items, items written more than once or not at all, and
  the output file's `custom_id`s (each exactly once).
- **limit**: one key with a small token limit (`--tpm 6000 --burst 2000`), `--clients` clients through HAProxy
  for `--duration` seconds, every request costing exactly 60 tokens (reference backend, end-of-text off). The
  tokens admitted against the most the limit allows over the same time (`burst + tpm/60 x elapsed`).
- **scale**: the real model, `--clients` streaming chat completions for `--duration` seconds, through HAProxy
  to one replica, then to three: generated tokens per second.

restart, kill and limit run on the reference backend (`--model` runs restart on the real model too): they
test the topology, not the model. `--write` replaces the "## Replicas behind HAProxy" section of
docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import io
import json
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tests.dbs import postgres_database, url_string

from bench.report import write_section
from sluicegate.testing.cluster import Cluster

HEADING = "## Replicas behind HAProxy"
REDIS = "redis://127.0.0.1:6379/0"


@contextmanager
def cluster(name: str, replicas: int = 3, *, model: bool = False, args: list[str] | None = None,
            redis: bool = True) -> Iterator[tuple[Cluster, str]]:
    """A cluster on a database of its own, and that database's URL."""
    with postgres_database() as url:
        db = url_string(url)  # a fresh database: fresh key ids, so fresh Redis buckets too
        with Cluster(Path(tempfile.mkdtemp(prefix=f"sg-cluster-{name}-")), db, REDIS if redis else None,
                     replicas_n=replicas, model=model, args=[*(args or []), "--log-level", "warning"]) as c:
            yield c, db


def openai_client(c: Cluster, key: str, sent: Counter[str]) -> Any:
    from openai import OpenAI

    def count(request: httpx.Request) -> None:
        sent["http requests"] += 1

    http = httpx.Client(verify=c.tls, timeout=120, event_hooks={"request": [count]})
    return OpenAI(base_url=f"{c.url}/v1", api_key=key, http_client=http)  # default max_retries=2


def restart(args: argparse.Namespace, model: bool) -> dict[str, Any]:
    body = {"model": "smollm2-135m-instruct" if model else "reference", "max_tokens": 16, "temperature": 0,
            "messages": [{"role": "user", "content": "Say hello."}]}
    with cluster("restart", model=model, args=["--drain-seconds", "20"]) as (c, _db):
        tally: Counter[str] = Counter()
        stop = threading.Event()

        def client() -> None:
            oa = openai_client(c, "unused", tally)
            while not stop.is_set():
                try:
                    oa.chat.completions.create(**body)
                    tally["succeeded"] += 1
                except Exception as exc:
                    tally["failed"] += 1
                    tally[f"failed: {type(exc).__name__}"] += 1

        threads = [threading.Thread(target=client) for _ in range(args.clients)]
        for t in threads:
            t.start()
        start = time.monotonic()
        statuses = []
        try:
            time.sleep(args.settle)
            for i in range(3):
                statuses.append(c.restart(i))
                time.sleep(args.settle)
        finally:
            stop.set()
            for t in threads:
                t.join(timeout=300)
        calls = tally["succeeded"] + tally["failed"]
        return {"backend": "model" if model else "reference", "seconds": round(time.monotonic() - start, 1),
                "calls": calls, "failed": tally["failed"], "retries": tally["http requests"] - calls,
                "exit statuses": statuses, "detail": {k: v for k, v in tally.items() if k.startswith("failed:")}}


def kill(args: argparse.Namespace) -> dict[str, Any]:
    from tests.jobs.crash import done_count, items

    from sluicegate.store.db import Store

    n = 300
    slow = ["--step-delay-ms", "20", "--eos-slope", "0", "--batch-lease-seconds", "3", "--batch-poll-seconds", "0.2"]
    with cluster("kill", args=slow) as (c, db):
        rows = [{"custom_id": f"r{i}", "method": "POST", "url": "/v1/completions",
                 "body": {"model": "reference", "prompt": f"item {i}", "max_tokens": 12, "temperature": 0}}
                for i in range(n)]
        data = b"".join(json.dumps(r).encode() + b"\n" for r in rows)
        admin = Store.open(db)
        try:
            with httpx.Client(base_url=c.url, verify=c.tls, timeout=60) as h:
                f = h.post("/v1/files", files={"file": ("in.jsonl", io.BytesIO(data))}, data={"purpose": "batch"})
                job = h.post("/v1/batches", json={"input_file_id": f.json()["id"], "endpoint": "/v1/completions",
                                                  "completion_window": "24h"}).json()["id"]
                start = time.monotonic()
                while done_count(admin, job) < n // 3:
                    time.sleep(0.05)
                leased = sorted(Counter(r.owner for r in items(admin, job) if r.state == "leased").values())
                c.kill9(1)
                killed_at = done_count(admin, job)
                c.start(1)
                while h.get(f"/v1/batches/{job}").json()["status"] not in ("completed", "failed", "expired"):
                    time.sleep(0.2)
                batch = h.get(f"/v1/batches/{job}").json()
                out = h.get(f"/v1/files/{batch['output_file_id']}/content").text.splitlines()
            ids = Counter(json.loads(line)["custom_id"] for line in out)
            final = items(admin, job)
        finally:
            admin.close()
        writes = Counter(r.result_writes for r in final)
        return {"items": n, "done when killed": killed_at, "leases held per replica at the kill": leased,
                "items taken over (leased again)": sum(r.attempts > 1 for r in final),
                "status": batch["status"], "seconds": round(time.monotonic() - start, 1),
                "items written once": writes[1], "written twice or more": sum(v for k, v in writes.items() if k > 1),
                "never written": writes[0], "output lines": len(out),
                "custom_ids once each": len(ids) == n and set(ids.values()) == {1}}


def limit(args: argparse.Namespace) -> dict[str, Any]:
    from sluicegate.store.db import Store
    from sluicegate.tenancy.keys import Scope, create_key

    tpm, burst, new = 6000, 2000, 40
    with cluster("limit", args=["--eos-slope", "0"]) as (c, db):
        admin = Store.open(db)
        try:
            _rec, secret = create_key(admin, "bench", {Scope.GENERATE}, tpm=tpm, burst=burst)
        finally:
            admin.close()
        tally: Counter[str] = Counter()
        times: list[float] = []
        lock = threading.Lock()
        stop = threading.Event()
        body = {"prompt": "tokens tokens", "max_new_tokens": new, "temperature": 0}

        def client() -> None:
            with httpx.Client(verify=c.tls, timeout=60, headers={"Authorization": f"Bearer {secret}"}) as h:
                while not stop.is_set():
                    r = h.post(f"{c.url}/v1/generate", json=body)
                    with lock:
                        times.append(time.monotonic())
                        tally[str(r.status_code)] += 1
                        if r.status_code == 200:
                            u = r.json()["usage"]
                            tally["tokens"] += u["prompt_tokens"] + u["completion_tokens"]
                    if r.status_code == 429:
                        time.sleep(min(1.0, float(r.headers.get("retry-after-ms", "100")) / 1e3))

        threads = [threading.Thread(target=client) for _ in range(args.clients)]
        start = time.monotonic()
        for t in threads:
            t.start()
        time.sleep(args.duration)
        stop.set()
        for t in threads:
            t.join(timeout=120)
        elapsed = max(times) - start
        bound = burst + tpm / 60 * elapsed
        return {"seconds": round(elapsed, 1), "admitted tokens": tally["tokens"], "bound": round(bound),
                "admitted / bound": round(tally["tokens"] / bound, 3), "200": tally["200"], "429": tally["429"],
                "other": sum(v for k, v in tally.items() if k not in ("200", "429", "tokens"))}


def throughput(c: Cluster, clients: int, duration: float) -> dict[str, Any]:
    """`clients` streaming chat completions without a pause for `duration` seconds: generated tokens/s."""
    tally: Counter[str] = Counter()
    stop = threading.Event()
    body = {"model": "smollm2-135m-instruct", "max_tokens": 64, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}}

    def client(k: int) -> None:
        with httpx.Client(verify=c.tls, timeout=300) as h:
            i = 0
            while not stop.is_set():
                text = f"({k}.{i}) Write a short story about a lighthouse."
                i += 1
                with h.stream("POST", f"{c.url}/v1/chat/completions",
                              json={**body, "messages": [{"role": "user", "content": text}]}) as r:
                    for line in r.iter_lines():
                        if line.startswith("data: {") and '"usage"' in line:
                            u = json.loads(line[6:]).get("usage")
                            if u:
                                tally["tokens"] += u["completion_tokens"]
                tally["requests"] += 1

    threads = [threading.Thread(target=client, args=(k,)) for k in range(clients)]
    start = time.monotonic()
    for t in threads:
        t.start()
    time.sleep(duration)
    stop.set()
    for t in threads:
        t.join(timeout=300)
    wall = time.monotonic() - start
    return {"tokens/s": round(tally["tokens"] / wall, 1), "requests": tally["requests"]}


def scale(args: argparse.Namespace) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for n in (1, 3):
        with cluster(f"scale{n}", replicas=n, model=True, redis=False) as (c, _db):
            out[f"{n} replica{'s' if n > 1 else ''}"] = throughput(c, args.clients, args.duration)
    one, three = out["1 replica"]["tokens/s"], out["3 replicas"]["tokens/s"]
    out["3 / 1"] = round(three / one, 2) if one else None
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--scenario", choices=["all", "restart", "kill", "limit", "scale"], default="all")
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--duration", type=float, default=60.0, help="seconds of load (limit, scale)")
    ap.add_argument("--settle", type=float, default=5.0, help="seconds of load before and after each restart")
    ap.add_argument("--model", action="store_true", help="restart: also on the real model")
    ap.add_argument("--write", action="store_true")
    args = ap.parse_args()
    results: dict[str, Any] = {}
    todo = ["restart", "kill", "limit", "scale"] if args.scenario == "all" else [args.scenario]
    for name in todo:
        if name == "restart":
            results["restart (reference)"] = restart(args, model=False)
            if args.model:
                results["restart (model)"] = restart(args, model=True)
        else:
            results[name] = {"kill": kill, "limit": limit, "scale": scale}[name](args)
        print(name, json.dumps(results, indent=1), flush=True)
    if args.write:
        write_section(HEADING, render(results, args))


def render(results: dict[str, Any], args: argparse.Namespace) -> str:
    lines = [HEADING, "", f"`bench/cluster.py` ({time.strftime('%Y-%m-%d')}; `flock /work/helpers/bench.lock "
             f".venv/bin/python bench/cluster.py --write{' --model' if args.model else ''} --clients {args.clients} "
             f"--duration {args.duration:g}`): three replicas on one Postgres and one Redis behind deploy/haproxy.cfg "
             "(HAProxy 2.6 from Debian), TLS, all processes on this 2-core machine.", ""]
    for name, r in results.items():
        lines.append(f"- **{name}**: " + "; ".join(f"{k} {v}" for k, v in r.items()))
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
