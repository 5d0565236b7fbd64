"""An operator's bad day: three replicas behind deploy/haproxy.cfg (TLS) on a Postgres and a Redis of their own,
each fault in turn, with what clients saw, what was computed more than once, and what was lost.

    .venv/bin/python bench/chaos.py            # ~2 minutes; prints one table (docs/benchmarks.md, "Chaos")

Postgres is a cluster of its own (`initdb` into a temporary directory, run as the `postgres` user on a spare
port) and Redis a `redis-server` on a spare port: the machine's shared ones are never touched, so the faults
(stopping Postgres, freezing Redis) hurt nobody else. The replicas are the reference server
(sluicegate.testing.refserver, 20 ms a step), so a run takes minutes and what it checks is the boundary, not
the model. Clients are the official `openai` SDK (its own retries, 2) and httpx, through HAProxy.

The faults, and how each is checked:

1. store read-only (`default_transaction_read_only`, reloaded): 10 `responses.create` through the SDK. Every
   call must end 200 with `store: false`; the replicas' access lines for POST /v1/responses must number one a
   call (each line is one generation: HAProxy's and the SDK's retries would add lines).
2. Postgres stopped for 20 s (`pg_ctl stop -m fast`, then started): keyed chat completions back to back through
   the SDK for the whole outage. Every one must be answered (the key was verified before the outage and is
   accepted from the cache through it).
3. kill -9 of the replica running a request with an Idempotency-Key (120 tokens, 2.4 s): the client must get
   200, and a retry of the key the replay; the work completed once (one 200 access line for the key's
   request id on the surviving replicas).
4. kill -9 of a replica mid-batch (a 60-item batch prediction job), restarted at once: the job must complete
   with every line's result written exactly once (`result_writes`, checked in the store).
5. Redis frozen (SIGSTOP) under a rate-limited key: 10 requests, each refused 503 `rate_limiter_unavailable`
   in about the limiter's bound (0.5 s), not several.
"""

from __future__ import annotations

import argparse
import json
import os
import pwd
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

import httpx
import openai
from sqlalchemy import create_engine, text

from sluicegate.store.db import Store
from sluicegate.tenancy.keys import Scope, create_key
from sluicegate.testing.cluster import Cluster, free_port
from sluicegate.testing.wait import wait_for

PG_BIN = next(iter(sorted(Path("/usr/lib/postgresql").glob("*/bin"))), Path("/usr/bin"))


@contextmanager
def own_postgres(directory: Path) -> Iterator[tuple[str, Any]]:
    """A Postgres cluster of this run's own, as the `postgres` user: its URL, and a function running pg_ctl."""
    data = directory / "pg"
    data.mkdir()
    user = pwd.getpwnam("postgres")
    os.chown(directory, user.pw_uid, user.pw_gid)
    os.chown(data, user.pw_uid, user.pw_gid)
    port = free_port()

    def as_postgres(*cmd: str) -> None:
        subprocess.run(["runuser", "-u", "postgres", "--", *cmd], check=True, capture_output=True)

    def ctl(action: str) -> None:
        extra = ["-o", f"-p {port} -k {directory} -c listen_addresses=127.0.0.1 -c fsync=off"] if action == "start" \
            else ["-m", "fast"] if action == "stop" else []
        as_postgres(str(PG_BIN / "pg_ctl"), "-D", str(data), "-w", "-l", str(directory / "pg.log"), action, *extra)

    as_postgres(str(PG_BIN / "initdb"), "-D", str(data), "-A", "trust", "-U", "postgres")
    ctl("start")
    try:
        subprocess.run(["runuser", "-u", "postgres", "--", str(PG_BIN / "createdb"), "-h", "127.0.0.1", "-p",
                        str(port), "chaos"], check=True, capture_output=True)
        yield f"postgresql+psycopg://postgres@127.0.0.1:{port}/chaos", ctl
    finally:
        with suppress(subprocess.CalledProcessError):
            ctl("stop")


@contextmanager
def own_redis() -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    port = free_port()
    proc = subprocess.Popen(["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                             "--appendonly", "no"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for(lambda: subprocess.run(["redis-cli", "-p", str(port), "ping"], capture_output=True).stdout
                 .strip() == b"PONG", message="redis")
        yield f"redis://127.0.0.1:{port}/0", proc
    finally:
        proc.send_signal(signal.SIGCONT)
        proc.terminate()
        proc.wait(10)


def access_lines(c: Cluster) -> list[dict[str, Any]]:
    out = []
    for r in c.replicas:
        for line in r.log_path.read_text(errors="replace").splitlines():
            if line.startswith("{") and '"event": "access"' in line:
                out.append(json.loads(line))
    return out


def sql(url: str, *statements: str) -> None:
    engine = create_engine(url, isolation_level="AUTOCOMMIT")
    try:
        with engine.connect() as conn:
            for s in statements:
                conn.execute(text(s))
    finally:
        engine.dispose()


def row(fault: str, calls: int, answered: int, fivexx: int, twice: int, lost: int, checked: str) -> dict[str, Any]:
    return {"fault": fault, "calls": calls, "answered": answered, "5xx": fivexx, "computed twice": twice,
            "lost": lost, "checked by": checked}


def read_only(c: Cluster, url: str, secret: str, http: httpx.Client) -> dict[str, Any]:
    client = openai.OpenAI(base_url=f"{c.url}/v1", api_key=secret, http_client=http, max_retries=2)
    before = Counter(x["route"] for x in access_lines(c) if x["method"] == "POST")
    sql(url, "ALTER SYSTEM SET default_transaction_read_only = on", "SELECT pg_reload_conf()")
    answered = fivexx = 0
    try:
        for i in range(10):
            try:
                r = client.responses.create(model="reference", input=f"read-only {i}", max_output_tokens=8)
                answered += r.store is False
            except openai.APIStatusError as exc:
                fivexx += exc.status_code >= 500
    finally:
        sql(url, "ALTER SYSTEM RESET default_transaction_read_only", "SELECT pg_reload_conf()")
    def generations() -> int:  # the replicas write an access line as each request ends
        return Counter(x["route"] for x in access_lines(c) if x["method"] == "POST")["/v1/responses"] - \
            before["/v1/responses"]

    wait_for(lambda: generations() >= answered, message="an access line for each answered call")
    runs = generations()
    return row("Postgres read-only: responses.create (SDK, 2 retries)", 10, answered, fivexx, max(0, runs - 10),
               0, f"{runs} generations for 10 calls (replicas' access lines)")


def pg_stopped(c: Cluster, ctl: Any, secret: str, http: httpx.Client, outage_s: float) -> dict[str, Any]:
    client = openai.OpenAI(base_url=f"{c.url}/v1", api_key=secret, http_client=http, max_retries=2)
    ask = {"model": "reference", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    client.chat.completions.create(**ask)  # the key verified once before the outage
    calls = answered = fivexx = 0
    ctl("stop")
    end = time.monotonic() + outage_s
    try:
        while time.monotonic() < end:
            calls += 1
            try:
                client.chat.completions.create(**ask)
                answered += 1
            except openai.APIStatusError as exc:
                fivexx += exc.status_code >= 500
    finally:
        ctl("start")
    return row(f"Postgres stopped {outage_s:g} s: keyed chat (SDK)", calls, answered, fivexx, 0, calls - answered,
               "every call's outcome")


def killed_mid_request(c: Cluster, secret: str, http: httpx.Client) -> dict[str, Any]:
    body = {"prompt": "Hello", "max_new_tokens": 120, "temperature": 0}
    key = {"Authorization": f"Bearer {secret}"}
    headers = {**key, "Idempotency-Key": "chaos-kill-1", "X-Request-Id": "chaos-kill-1"}
    got: list[httpx.Response] = []
    sender = threading.Thread(target=lambda: got.append(http.post(f"{c.url}/v1/generate", json=body,
                                                                  headers=headers, timeout=120)))
    sender.start()

    def running_on() -> list[int]:
        return [r.index for r in c.replicas if r.proc is not None and r.proc.poll() is None
                and any(line.startswith("sluicegate_running{") and not line.endswith(" 0.0")
                        for line in httpx.get(f"{r.url}/metrics", headers=key, timeout=10).text.splitlines())]

    (victim,) = wait_for(running_on, message="the request running on a replica")
    c.kill9(victim)
    sender.join(120)
    again = http.post(f"{c.url}/v1/generate", json=body, headers={**key, "Idempotency-Key": "chaos-kill-1"},
                      timeout=60)
    ok = got and got[0].status_code == 200 and again.headers.get("idempotent-replayed") == "true" \
        and again.json()["token_ids"] == got[0].json()["token_ids"]
    done = [x for x in access_lines(c) if x.get("request_id") == "chaos-kill-1" and x["status"] == 200]
    c.start(victim)
    c.wait_in_rotation(range(3))
    return row("kill -9 mid-request, Idempotency-Key (httpx)", 1, int(bool(ok)),
               int(bool(got) and got[0].status_code >= 500), max(0, len(done) - 1), 0 if ok else 1,
               f"{len(done)} completed run(s) of the key; the retry replayed it")


def killed_mid_batch(c: Cluster, url: str, secret: str, http: httpx.Client) -> dict[str, Any]:
    items = [{"input": {"prompt": f"item {i}"}, "options": {"max_new_tokens": 16}} for i in range(60)]
    job = http.post(f"{c.url}/v1/batch-predictions", json=items, headers={"Authorization": f"Bearer {secret}"})
    job_id = job.json()["id"]
    engine = create_engine(url)

    def done_items() -> int:
        with engine.connect() as conn:
            return int(conn.execute(text("SELECT count(*) FROM batch_items WHERE job_id = :j AND state = 'done'"),
                                    {"j": job_id}).scalar_one())

    wait_for(lambda: done_items() >= 10, message="a sixth of the batch")
    c.kill9(1)
    c.start(1)

    def finished() -> bool:
        with engine.connect() as conn:
            return conn.execute(text("SELECT status FROM batch_jobs WHERE id = :j"), {"j": job_id}).scalar_one() \
                == "completed"

    wait_for(finished, 300, message="the batch to complete")
    with engine.connect() as conn:
        writes = [int(w) for (w,) in conn.execute(text("SELECT result_writes FROM batch_items WHERE job_id = :j"),
                                                  {"j": job_id})]
    engine.dispose()
    c.wait_in_rotation(range(3))
    return row("kill -9 mid-batch (60 items), restarted", 60, sum(1 for w in writes if w >= 1), 0,
               sum(1 for w in writes if w > 1), sum(1 for w in writes if w == 0),
               "result_writes of every item in the store")


def redis_frozen(c: Cluster, redis: subprocess.Popen[bytes], limited: str, http: httpx.Client) -> dict[str, Any]:
    body = {"prompt": "hi", "max_new_tokens": 2}
    waits, statuses = [], []
    redis.send_signal(signal.SIGSTOP)
    try:
        for _ in range(10):
            t = time.perf_counter()
            r = http.post(f"{c.replicas[0].url}/v1/generate", json=body, headers={"Authorization": f"Bearer {limited}"})
            waits.append(time.perf_counter() - t)
            statuses.append(r.status_code)
    finally:
        redis.send_signal(signal.SIGCONT)
    return row(f"Redis frozen: a rate-limited key, one replica directly (median {statistics.median(waits):.2f} s, "
               f"max {max(waits):.2f} s a refusal)", 10, 0, sum(s >= 500 for s in statuses), 0, 0,
               f"statuses {dict(Counter(statuses))}: refused, as the limiter fails closed")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--outage-s", type=float, default=20.0)
    args = p.parse_args()
    if os.geteuid() != 0 or shutil.which("runuser") is None:
        print("chaos: runs as root (its own Postgres runs as the postgres user)", file=sys.stderr)
        return 2
    directory = Path(tempfile.mkdtemp(prefix="sluicegate-chaos-"))
    results = []
    with own_postgres(directory) as (url, ctl), own_redis() as (redis_url, redis):
        subprocess.run([sys.executable, "-m", "sluicegate", "db", "upgrade", "--database-url", url], check=True,
                       capture_output=True)
        store = Store.open(url)
        _k, secret = create_key(store, "chaos", {Scope.GENERATE, Scope.BATCH, Scope.METRICS})
        _l, limited = create_key(store, "limited", {Scope.GENERATE}, tpm=600_000)
        store.close()
        with Cluster(directory / "cluster", url, redis_url, args=["--step-delay-ms", "20", "--eos-slope", "0"]) as c, \
                httpx.Client(verify=c.tls, timeout=120) as http:
            results.append(read_only(c, url, secret, http))
            results.append(pg_stopped(c, ctl, secret, http, args.outage_s))
            c.wait_in_rotation(range(3))
            results.append(killed_mid_request(c, secret, http))
            results.append(killed_mid_batch(c, url, secret, http))
            results.append(redis_frozen(c, redis, limited, http))
    cols = list(results[0])
    print("| " + " | ".join(cols) + " |")
    print("|" + "---|" * len(cols))
    for r in results:
        print("| " + " | ".join(str(r[k]) for k in cols) + " |")
    shutil.rmtree(directory, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
