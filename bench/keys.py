"""API keys: what a cached lookup costs, what a lookup that reaches the store costs, what the auth middleware
adds to a request over a socket, and how long a revocation takes to be refused by a server.

    flock /tmp/sluicegate-bench.lock .venv/bin/python bench/keys.py [--runs 20000] [--write]

On SQLite (a file) and on Postgres (a fresh database on 127.0.0.1:5432, dropped afterwards; skipped when absent):

1. in process: `KeyCache.lookup` for a cached key, and with the cache emptied before each call (one indexed
   query in a worker thread); `UsageLedger.record` (what a metered request adds when it ends);
2. over a socket: the reference server (`sluicegate.testing.refserver --database-url`, a subprocess) holding
   one key, one `GET /v1/models` at a time on a keep-alive connection; the `auth` stage it reports in
   Server-Timing (the middleware's whole cost: header parsing, format check, hash, cache);
3. revocation: the key is used (so every cache holds it as valid), revoked through another engine (as `sluicegate
   keys revoke` or another replica would), and the server polled every 5 ms until it answers 401; repeated.

`--write` replaces the "## API keys" section of docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import platform
import secrets
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from bench.report import percentile, publish  # noqa: E402
from sluicegate.store.db import Store  # noqa: E402
from sluicegate.store.migrate import upgrade  # noqa: E402
from sluicegate.tenancy.key_cache import KeyCache  # noqa: E402
from sluicegate.tenancy.keys import Scope, create_key, revoke_key  # noqa: E402
from sluicegate.tenancy.usage import UsageLedger  # noqa: E402
from sluicegate.testing.refserver import running  # noqa: E402

HEADING = "## API keys"
PG_ADMIN = os.environ.get("SLUICEGATE_TEST_POSTGRES", "postgresql+psycopg://postgres@127.0.0.1:5432/test")


@contextlib.contextmanager
def databases() -> Iterator[list[tuple[str, str]]]:
    """(label, URL) of a SQLite file and, when reachable, a fresh Postgres database; both migrated."""
    from sqlalchemy import create_engine, text
    from sqlalchemy.engine import make_url

    with tempfile.TemporaryDirectory() as tmp:
        out = [("SQLite", f"sqlite:///{tmp}/bench.db")]
        admin = create_engine(PG_ADMIN, isolation_level="AUTOCOMMIT")
        name = f"sluicegate_b_{secrets.token_hex(6)}"
        try:
            with admin.connect() as conn:
                conn.execute(text(f'CREATE DATABASE "{name}"'))
            out.append(("Postgres", make_url(PG_ADMIN).set(database=name).render_as_string(hide_password=False)))
        except Exception as exc:
            print(f"Postgres skipped: {type(exc).__name__}", file=sys.stderr)
            name = ""
        for _, url in out:
            upgrade(url)
        try:
            yield out
        finally:
            if name:
                with admin.connect() as conn:
                    conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
            admin.dispose()


def in_process(url: str, runs: int) -> dict[str, list[float]]:
    """Microseconds per call."""
    store = Store.open(url)
    try:
        key, secret = create_key(store, "bench", {Scope.GENERATE})
        cache = KeyCache(store)
        out: dict[str, list[float]] = {"cached": [], "query": [], "record": []}

        async def measure() -> None:
            await cache.lookup(secret)
            for _ in range(runs):
                t = time.perf_counter_ns()
                await cache.lookup(secret)
                out["cached"].append((time.perf_counter_ns() - t) / 1e3)
            for _ in range(max(50, runs // 100)):
                cache.forget()
                t = time.perf_counter_ns()
                await cache.lookup(secret)
                out["query"].append((time.perf_counter_ns() - t) / 1e3)

        asyncio.run(measure())
        ledger = UsageLedger(store)
        ledger.start()
        for _ in range(runs // 10):
            t = time.perf_counter_ns()
            ledger.record(key.id, "/v1/generate", 10, 0, 5, 200, request_id="req_bench")
            out["record"].append((time.perf_counter_ns() - t) / 1e3)
        ledger.close()
        return out
    finally:
        store.close()


def over_socket(url: str, runs: int) -> tuple[list[float], list[float]]:
    """(auth stage ms per request, revocation delays in ms)."""
    admin = Store.open(url)
    with tempfile.TemporaryDirectory() as tmp, running(Path(tmp), "--database-url", url) as srv:
        _, secret = create_key(admin, "bench", {Scope.GENERATE})
        headers = {"x-api-key": secret}
        stage: list[float] = []
        with httpx.Client(base_url=srv.url, headers=headers, timeout=30) as c:
            deadline = time.monotonic() + 30
            while c.get("/v1/models").status_code != 200:  # the server sees the first key within its TTL
                if time.monotonic() > deadline:
                    raise RuntimeError("the key never worked")
            for _ in range(runs):
                r = c.get("/v1/models")
                parts = dict(p.split(";dur=") for p in r.headers["server-timing"].split(", "))
                stage.append(float(parts["auth"]))
        delays: list[float] = []
        for _ in range(10):
            key, secret = create_key(admin, "bench", {Scope.GENERATE})
            with httpx.Client(base_url=srv.url, headers={"x-api-key": secret}, timeout=30) as c:
                while c.get("/v1/models").status_code != 200:
                    pass
                revoke_key(admin, key.id)
                t = time.monotonic()
                while c.get("/v1/models").status_code != 401:
                    time.sleep(0.005)
                delays.append((time.monotonic() - t) * 1e3)
    admin.close()
    return stage, delays


def row(label: str, xs: list[float], unit: str) -> str:
    return f"| {label} | {len(xs)} | {percentile(xs, 0.5):.2f} | {percentile(xs, 0.99):.2f} | {unit} |"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=20000, help="cached lookups; a tenth as many socket requests")
    ap.add_argument("--write", action="store_true", help="replace the section in docs/benchmarks.md")
    args = ap.parse_args()
    lines = [
        HEADING, "",
        f"Command: `flock /tmp/sluicegate-bench.lock .venv/bin/python bench/keys.py"
        f"{' --runs ' + str(args.runs) if args.runs != 20000 else ''}{' --write' if args.write else ''}` "
        f"({time.strftime('%Y-%m-%d %H:%M')}, load average {os.getloadavg()[0]:.1f}). Machine: {platform.machine()}, "
        f"{os.cpu_count()} cores shared with other work, Python {platform.python_version()}.",
        "",
        "| what | n | median | p99 | unit |",
        "|---|---|---|---|---|",
    ]
    with databases() as dbs:
        for label, url in dbs:
            cost = in_process(url, args.runs)
            stage, delays = over_socket(url, max(200, args.runs // 10))
            lines += [
                row(f"{label}: cached lookup (`KeyCache.lookup`, in process)", cost["cached"], "µs"),
                row(f"{label}: lookup that queries the store (worker thread)", cost["query"], "µs"),
                row(f"{label}: `UsageLedger.record` (a metered request's end)", cost["record"], "µs"),
                row(f"{label}: auth stage over a socket (Server-Timing `auth`)", stage, "ms"),
                row(f"{label}: revocation to first 401 (polled every 5 ms)", delays, "ms"),
            ]
    lines += [
        "",
        "How to read it: the auth stage is the whole per-request cost of API keys on the request path (parse the "
        "header, check the format and checksum, hash, find the cached answer); the ledger row adds one "
        "`record` call when a metered request ends (a queue append; a background thread writes). Once per "
        "`key_cache_ttl_s` (0.5 s) per key per process one request instead pays a lookup that queries the store "
        "(the second row), so a revocation is refused after the TTL plus that query: the last row, under the 1 s "
        "promise. Unknown keys are remembered for the same TTL.",
    ]
    text = "\n".join([*lines, ""])
    publish(HEADING, text, args.write)


if __name__ == "__main__":
    main()
