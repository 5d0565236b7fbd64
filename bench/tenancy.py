"""Tenancy cost per request: what auth + a rate limit + an Idempotency-Key add to one request, median and p99.

    flock /tmp/sluicegate-bench.lock .venv/bin/python bench/tenancy.py [--runs 2000] [--pause-ms 5] [--write]

Two setups: SQLite + the in-process limiter, and Postgres + Redis (a fresh database on 127.0.0.1:5432 and the
Redis at 127.0.0.1:6379; skipped when absent). In each, two reference servers (`sluicegate.testing.refserver`,
subprocesses) are started side by side with the same flags; they differ only in what their store holds:

- **plain**: a store with no key, so auth is off: no key, no limit, no Idempotency-Key;
- **tenancy**: a store holding one key with a limit (`tpm` and `burst` high enough never to refuse: the limiter
  reserves and settles on every request), every request sending it and a new Idempotency-Key (claimed, then
  its answer stored); and the same request again (**replay**: the stored answer, nothing generated).

A request cannot be both with and without a key on one server (a store holding a key refuses requests without
one), hence two; they run at the same time and the requests are interleaved (replay of the last round's key,
plain, tenancy; a pause; again) one at a time over one keep-alive connection per server, so drift and load hit
all three alike. Each
request is `/v1/generate` with a one-token answer. Client wall time (perf_counter around the request) and the
server's own total (Server-Timing) are reported; *added* is tenancy minus plain, per interleaved pair.

Then, in this process, the idempotency store's statements alone on each database (a claim, the answer stored,
a replay's claim attempt), through the engine they use (`make_engine(relaxed=True)`: no fsync per commit, no
ping per checkout) and through the store's ordinary engine, to show what that choice buys.

`--write` replaces the "## Tenancy cost per request" section of docs/benchmarks.md.
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
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from bench.keys import PG_ADMIN  # noqa: E402
from bench.report import percentile, publish  # noqa: E402
from sluicegate.store.db import Store  # noqa: E402
from sluicegate.store.migrate import upgrade  # noqa: E402
from sluicegate.tenancy.idempotency import IdempotencyStore, StoredAnswer  # noqa: E402
from sluicegate.tenancy.keys import Scope, create_key  # noqa: E402
from sluicegate.testing.refserver import running  # noqa: E402

HEADING = "## Tenancy cost per request"
REDIS_URL = "redis://127.0.0.1:6379/0"
BODY = {"prompt": "Hello", "max_new_tokens": 1, "temperature": 0}
WARMUP = 50
TARGET_MS = {"SQLite + in-process limiter": 0.3, "Postgres + Redis": 1.0}
TARGETS: list[tuple[str, float]] = []  # (setup, added median) as measured


@contextlib.contextmanager
def setups(tmp: Path) -> Iterator[list[tuple[str, str, str, list[str]]]]:
    """(label, plain store URL, tenancy store URL, extra server flags) per setup, every store migrated."""
    from sqlalchemy import create_engine, text
    from sqlalchemy.engine import make_url

    out = [("SQLite + in-process limiter", f"sqlite:///{tmp}/plain.db", f"sqlite:///{tmp}/tenancy.db", [])]
    admin = create_engine(PG_ADMIN, isolation_level="AUTOCOMMIT")
    names = [f"sluicegate_b_{secrets.token_hex(6)}" for _ in range(2)]
    try:
        import redis

        with redis.Redis.from_url(REDIS_URL, socket_connect_timeout=1) as r:
            r.ping()
        with admin.connect() as conn:
            for name in names:
                conn.execute(text(f'CREATE DATABASE "{name}"'))
        urls = [make_url(PG_ADMIN).set(database=n).render_as_string(hide_password=False) for n in names]
        out.append(("Postgres + Redis", urls[0], urls[1], ["--redis-url", REDIS_URL]))
    except Exception as exc:
        print(f"Postgres + Redis skipped: {type(exc).__name__}: {exc}", file=sys.stderr)
        names = []
    for _, plain, tenancy, _ in out:
        upgrade(plain)
        upgrade(tenancy)
    try:
        yield out
    finally:
        with admin.connect() as conn:
            for name in names:
                conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


def stage_ms(r: httpx.Response, stage: str) -> float:
    for part in r.headers["server-timing"].split(","):
        name, _, dur = part.strip().partition(";dur=")
        if name == stage:
            return float(dur)
    raise ValueError(f"no {stage} in Server-Timing")


def total_ms(r: httpx.Response) -> float:
    return stage_ms(r, "total")


def measure(plain_url: str, tenancy_url: str, secret: str, runs: int, pause_s: float) -> dict[str, list[float]]:
    """Milliseconds per request: client wall and server total, for plain, tenancy and replay.

    A round is: the replay of the previous round's key, a plain request, a request with a new key; then a pause,
    so what a request does after its answer (the answer written, the limit settled, the ledger row) has ended
    before the next round starts: each request is timed alone, as a client that is not hammering sees it."""
    out: dict[str, list[float]] = {k: [] for k in ("plain", "tenancy", "replay", "plain_srv", "tenancy_srv",
                                                     "replay_srv", "added", "added_srv", "auth", "claim",
                                                     "reserve")}
    auth = {"Authorization": f"Bearer {secret}"}
    previous: dict[str, str] | None = None
    with httpx.Client(base_url=plain_url, timeout=60) as plain, httpx.Client(base_url=tenancy_url, timeout=60) as ten:
        for i in range(WARMUP + runs + 1):
            if previous is not None:
                t = time.perf_counter()
                c = ten.post("/v1/generate", json=BODY, headers=previous)
                wall_c = (time.perf_counter() - t) * 1e3
                assert c.status_code == 200 and c.headers["idempotent-replayed"] == "true", c.text
                if i > WARMUP:
                    out["replay"].append(wall_c)
                    out["replay_srv"].append(total_ms(c))
            if i == WARMUP + runs:
                break
            t = time.perf_counter()
            a = plain.post("/v1/generate", json=BODY)
            wall_a = (time.perf_counter() - t) * 1e3
            previous = {**auth, "Idempotency-Key": uuid.uuid4().hex}
            t = time.perf_counter()
            b = ten.post("/v1/generate", json=BODY, headers=previous)
            wall_b = (time.perf_counter() - t) * 1e3
            assert a.status_code == b.status_code == 200, (a.text, b.text)
            assert "x-ratelimit-remaining-tokens" in b.headers and "idempotent-replayed" not in b.headers
            time.sleep(pause_s)
            if i < WARMUP:
                continue
            for name, wall, r in (("plain", wall_a, a), ("tenancy", wall_b, b)):
                out[name].append(wall)
                out[name + "_srv"].append(total_ms(r))
            out["added"].append(wall_b - wall_a)
            out["added_srv"].append(total_ms(b) - total_ms(a))
            out["auth"].append(stage_ms(b, "auth"))
            out["claim"].append(stage_ms(b, "idempotency"))
            out["reserve"].append(stage_ms(b, "ratelimit"))
    return out


def run_setup(tmp: Path, label: str, plain_db: str, tenancy_db: str, flags: list[str],
              runs: int, pause_s: float) -> list[str]:
    admin = Store.open(tenancy_db)
    try:
        _, secret = create_key(admin, "bench", {Scope.GENERATE}, tpm=10**9, burst=10**9)
    finally:
        admin.close()
    with running(tmp, "--database-url", plain_db, *flags) as a, running(tmp, "--database-url", tenancy_db,
                                                                          *flags) as b:
        deadline = time.monotonic() + 30
        while httpx.get(b.url + "/v1/models", headers={"x-api-key": secret}, timeout=30).status_code != 200:
            if time.monotonic() > deadline:
                raise RuntimeError("the key never worked")
        m = measure(a.url, b.url, secret, runs, pause_s)

    def row(name: str, what: str) -> str:
        wall, srv = m[name], m[name + "_srv"]
        return (f"| {label} | {what} | {len(wall)} | {percentile(wall, 0.5):.3f} | {percentile(wall, 0.99):.3f} "
                f"| {percentile(srv, 0.5):.3f} | {percentile(srv, 0.99):.3f} |")

    def stage(name: str, what: str) -> str:
        xs = m[name]
        return f"| {label} | {what} | {len(xs)} | | | {percentile(xs, 0.5):.3f} | {percentile(xs, 0.99):.3f} |"

    TARGETS.append((label, percentile(m["added"], 0.5)))
    return [
        row("plain", "plain: no key, no limit, no Idempotency-Key"),
        row("tenancy", "key + limit + new Idempotency-Key"),
        row("added", "**added** (paired difference)"),
        stage("auth", "of which the auth stage (Server-Timing `auth`)"),
        stage("claim", "of which the claim, on the event loop (Server-Timing `idempotency`)"),
        stage("reserve", "of which the limit's reservation (Server-Timing `ratelimit`)"),
        row("replay", "replay of a stored answer (key + limit)"),
    ]


def statements(url: str, runs: int, relaxed: bool) -> dict[str, list[float]]:
    """Milliseconds per claim, complete and replay claim, one at a time, in this thread."""
    store = Store.open(url)
    idem = IdempotencyStore(store)
    engine = idem._engine
    if not relaxed:
        idem._engine = store.engine  # the store's ordinary engine: fsync per commit, a ping per checkout
    answer = StoredAnswer(200, {"content-type": "application/json"}, b"x" * 600)
    out: dict[str, list[float]] = {"claim": [], "complete": [], "replay": []}
    try:
        for i in range(WARMUP + runs):
            key = uuid.uuid4().hex
            t = time.perf_counter()
            claim = idem.claim("key_bench", key, "/v1/generate", "f" * 64)
            t1 = time.perf_counter()
            idem.complete("key_bench", key, claim.owner, answer)
            t2 = time.perf_counter()
            idem.claim("key_bench", key, "/v1/generate", "f" * 64)
            t3 = time.perf_counter()
            if i >= WARMUP:
                for name, dt in (("claim", t1 - t), ("complete", t2 - t1), ("replay", t3 - t2)):
                    out[name].append(dt * 1e3)
        if relaxed:
            out["here"] = asyncio.run(claims_here(idem, runs))
    finally:
        engine.dispose()
        store.close()
    return out


async def claims_here(idem: IdempotencyStore, runs: int) -> list[float]:
    """Milliseconds per claim on the event loop (`claim_here`: what a request waits for), one at a time."""
    times = []
    try:
        for i in range(WARMUP + runs):
            key = uuid.uuid4().hex
            t = time.perf_counter()
            claim = await idem.claim_here("key_bench", key, "/v1/generate", "f" * 64)
            dt = time.perf_counter() - t
            assert claim is not None
            if i >= WARMUP:
                times.append(dt * 1e3)
    finally:
        await idem.aclose()
    return times


def statement_rows(label: str, url: str, runs: int) -> list[str]:
    rows = []
    for relaxed in (True, False):
        m = statements(url, runs, relaxed)
        how = "relaxed engine (shipped)" if relaxed else "the store's ordinary engine"
        rows.append(f"| {label} | {how} | " + " | ".join(
            f"{percentile(m[k], 0.5):.3f} / {percentile(m[k], 0.99):.3f}" if k in m else ""
            for k in ("here", "claim", "complete", "replay")) + " |")
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=2000, help="interleaved rounds per setup (after 50 warm-up)")
    ap.add_argument("--pause-ms", type=float, default=5.0, help="pause between rounds (measure() says why)")
    ap.add_argument("--write", action="store_true", help="replace the section in docs/benchmarks.md")
    args = ap.parse_args()
    started = time.strftime("%Y-%m-%d %H:%M")
    load = os.getloadavg()[0]
    rows: list[str] = []
    store_rows: list[str] = []
    with tempfile.TemporaryDirectory() as tmp, setups(Path(tmp)) as all_setups:
        for label, plain_db, tenancy_db, flags in all_setups:
            rows += run_setup(Path(tmp), label, plain_db, tenancy_db, flags, args.runs, args.pause_ms / 1e3)
        for label, _, tenancy_db, _ in all_setups:
            store_rows += statement_rows(label.split(" + ")[0], tenancy_db, args.runs)
    lines = [
        HEADING, "",
        f"Command: `flock /tmp/sluicegate-bench.lock .venv/bin/python bench/tenancy.py"
        f"{' --runs ' + str(args.runs) if args.runs != 2000 else ''}"
        f"{' --pause-ms ' + format(args.pause_ms, 'g') if args.pause_ms != 5.0 else ''}"
        f"{' --write' if args.write else ''}` "
        f"({started}, load average {load:.1f} at the start, {os.getloadavg()[0]:.1f} at the end). Machine: "
        f"{platform.machine()}, {os.cpu_count()} cores shared with other work, Python {platform.python_version()}.",
        "",
        "`/v1/generate` with a one-token answer, one request at a time over a keep-alive socket on 127.0.0.1, "
        "two reference servers side by side (bench/tenancy.py says why two), requests interleaved: each round is "
        f"the replay of the previous round's key, a plain request, a request with all three, then {args.pause_ms:g} ms "
        "of pause (what a request does after its answer has ended before the next round). Milliseconds. "
        "Targets for the added median: under 0.3 ms (SQLite + in-process), under 1 ms (Postgres + Redis).",
        "",
        "| setup | request | n | client wall median | client wall p99 | server total median | server total p99 |",
        "|---|---|---|---|---|---|---|",
        *rows,
        "",
        "What a request with all three pays: the auth stage (header, checksum, SHA-256, the cached key), the "
        "limiter's reserve and settle (in-process: a lock and arithmetic; Redis: a round trip each), the "
        "Idempotency-Key's claim (one insert) and its stored answer (one update). The claim is made at the "
        "serving core's gate, after the request is validated and tokenised (serving/core.py `admit`), at the "
        "same time as a Redis reservation: with Postgres and Redis a request waits for the longer round trip, "
        "not both (the two stages above overlap). Claim and answer run on the event loop (SQLite: the driver's "
        "own connection, tenancy/sqlite_claims.py, never waiting for the file's lock, a thread when another "
        "writer holds it; Postgres: psycopg's asynchronous connections); the answer after the client has it. "
        "The rest of the added time is the settle after the answer and the detached task the work runs in. A "
        "replay is the auth stage, one insert attempt and one read, and no engine work.",
        "",
        "Against the targets (added median, client wall): " + "; ".join(
            f"{label}: {added:.2f} ms for a target of {TARGET_MS[label]:g} ms "
            f"({'met' if added < TARGET_MS[label] else 'missed'})" for label, added in TARGETS) + ". "
        "The claim's insert costs about 0.04 ms (SQLite) and 0.2 ms (Postgres) in a hot loop (the table below, "
        "first column), 3x that on the server's colder path.",
        "",
        f"The idempotency store's statements alone, in process, {args.runs} of each, median / p99 in milliseconds:",
        "",
        "| database | engine | claim on the event loop (shipped path) | claim in a thread's engine (insert) "
        "| answer stored (update) | replay (insert attempt + read) |",
        "|---|---|---|---|---|---|",
        *store_rows,
        "",
        "The first column is the claim as a request makes it (`claim_here`); the others go through the "
        "thread's SQLAlchemy engine, the path taken when the loop's cannot (SQLite's write lock held). "
        "The relaxed engine (`store/db.py` `make_engine(relaxed=True)`) commits without waiting for the disk "
        "(SQLite `synchronous=NORMAL` in WAL mode, Postgres `synchronous_commit=off`) and does not ping a "
        "connection before each use (a dropped one is retried once). Only idempotency rows use it: losing the "
        "last claims in a machine crash means a retry runs again, as it would without a key.",
        "",
    ]
    text = "\n".join(lines)
    publish(HEADING, text, args.write)


if __name__ == "__main__":
    main()
