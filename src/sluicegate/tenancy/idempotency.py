"""Idempotency keys in the store: claim a key, store its answer or release it, replay, leases and expiry.

The store side of the IETF Idempotency-Key draft as Stripe runs it (docs/idempotency.md). Nothing here knows
HTTP: api/idempotency.py puts it on the routes. Every method is synchronous (SQLAlchemy); callers on the event
loop run them in a worker thread, except `claim_here` and `complete_here`, the claim and the answer on the loop
where they need not block it (a SQLite file with its write lock free, tenancy/sqlite_claims.py; Postgres over
asynchronous connections, tenancy/pg_claims.py).

- `claim()` inserts the row (scope, key) holding the request's fingerprint, unless one exists. The primary key
  is the unique constraint that decides between two requests claiming one key at once, in one process or on
  two replicas sharing the database: the insert that lands runs the work. The other reads the row: another
  fingerprint is `MISMATCH`; no answer yet is `IN_USE` (while the claim's lease holds); an answer is `REPLAY`.
  A row past its expiry is as good as absent (claimed anew in place), and so is a claim whose lease ran out
  with the same fingerprint (its process died): the work runs again, once.
- The holder ends its claim with `complete()` (the answer to replay) or `release()` (nothing kept: the request
  was refused before it ran, or its client was told to retry). Both touch only the holder's own claim
  (`owner`, a random token), so a holder whose lease was taken over cannot overwrite the new holder's work.
  `remember()` keeps an answer in the process while `complete()` writes it, so the answer can go to its client
  before the write has landed: a retry reaching this process meanwhile is replayed from memory.
- While the work runs, `renew()` (every third of the lease, one UPDATE for all of this process's claims)
  keeps the claims alive, so a long generation keeps its key and a crashed process's keys free up within
  one lease.
- Rows expire `ttl_s` after their claim; `prune()` deletes expired rows in bounded batches (each replica runs
  it now and then; a claim meeting an expired row replaces it itself, so pruning only bounds the table).

The claim and the answer are on every idempotent request's path, so they go through an engine of their own
(`make_engine(relaxed=True)`): commits do not wait for the disk, and connections are not pinged before use
(a dropped one is retried once). Every statement stands alone (autocommit: one round trip, no BEGIN and
COMMIT around it): the insert is the claim, and every later change is conditional on the row as it was read
(`owner`, `status`), so no statement needs another's transaction. A claim or answer lost in a machine crash
only means a retry runs the work again, as it would have without a key; docs/benchmarks.md has what the
fsync would cost.

Timestamps are the database's clock (`Store.now`, unless a clock is given), so replicas whose own clocks
differ agree on when a lease has run out.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import enum
import json
import logging
import secrets
import threading
import time
from collections.abc import Callable, Generator, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, TypeVar, cast

from sqlalchemy import (
    ClauseElement,
    Connection,
    CursorResult,
    Engine,
    Executable,
    Result,
    Table,
    bindparam,
    delete,
    insert,
    select,
    update,
)
from sqlalchemy.exc import DBAPIError, IntegrityError

from sluicegate.store.db import Store, make_engine, sqlite_relaxed_setup
from sluicegate.store.models import IdempotencyRecord
from sluicegate.tenancy.pg_claims import OperationalError as PgOperationalError
from sluicegate.tenancy.pg_claims import PgClaims
from sluicegate.tenancy.sqlite_claims import Busy, SqliteClaims

log = logging.getLogger("sluicegate.idempotency")

PRUNE_BATCH = 1000  # most expired rows one prune transaction deletes (ties on the cut-off may add a few)
T = TypeVar("T")
ClaimSteps = Generator[tuple[str, dict[str, Any]], Any, "Claim"]


class ClaimState(enum.Enum):
    """Where an Idempotency-Key stands for the request that claims it (`Claim.outcome`)."""

    CLAIMED = "claimed"  # this request holds the key: run the work, then complete() or release()
    REPLAY = "replay"  # the key's answer is stored: send it again
    IN_USE = "in_use"  # another request holds the key and is still running
    MISMATCH = "mismatch"  # the key was used for a different request


@dataclass(frozen=True, slots=True)
class StoredAnswer:
    """An answer as it is replayed: its status, the headers that matter, and its exact body bytes."""

    status: int
    headers: dict[str, str]
    body: bytes


@dataclass(frozen=True, slots=True)
class Claim:
    outcome: ClaimState
    owner: str = ""  # CLAIMED: the token complete() and release() need
    answer: StoredAnswer | None = None  # REPLAY: what to send


def _rows(result: Result[Any]) -> int:
    """Rows an INSERT, UPDATE or DELETE touched."""
    return int(cast(CursorResult[Any], result).rowcount)


def _set_up_quick(dbapi_conn: Any) -> None:
    """The event loop's SQLite connection: the store's relaxed set-up, and a statement that meets another
    writer's lock fails at once ("database is locked") instead of waiting for it."""
    sqlite_relaxed_setup(dbapi_conn)
    cur = dbapi_conn.cursor()
    cur.execute("PRAGMA busy_timeout=0")
    cur.close()


def _utc(value: dt.datetime) -> dt.datetime:
    """Core statements return the column type's Python values: SQLite's are naive (and UTC)."""
    return value.replace(tzinfo=dt.UTC) if value.tzinfo is None else value


TABLE = cast(Table, IdempotencyRecord.__table__)
C = TABLE.c
_THIS = (C.scope == bindparam("b_scope"), C.key == bindparam("b_key"))  # "b_": SET takes the column names
_HOLDER = (*_THIS, C.owner == bindparam("b_owner"), C.status.is_(None))
_READ = select(C.fingerprint, C.expires_at, C.locked_until, C.owner, C.status, C.headers, C.body).where(*_THIS)
_TAKE_OVER = update(TABLE).where(*_THIS, C.owner == bindparam("b_owner"))
_FRESH = ("route", "fingerprint", "owner", "created_at", "locked_until", "expires_at", "status", "headers", "body")
_COMPLETE = update(TABLE).where(*_HOLDER)
_ANSWER = ("status", "headers", "body", "locked_until")
_RELEASE = delete(TABLE).where(*_HOLDER)


def _insert_unless_there(dialect: str) -> Executable | None:
    """INSERT that does nothing when the key exists, returning the owner only when it inserted; None for a
    database without `ON CONFLICT` (the plain insert's IntegrityError then says the key exists)."""
    if dialect == "postgresql":
        from sqlalchemy.dialects.postgresql import insert as pg_insert

        return pg_insert(TABLE).on_conflict_do_nothing().returning(C.owner)
    if dialect == "sqlite":
        from sqlalchemy.dialects.sqlite import insert as sqlite_insert

        return sqlite_insert(TABLE).on_conflict_do_nothing().returning(C.owner)
    return None


def _one(op: str, params: dict[str, Any]) -> Generator[tuple[str, dict[str, Any]], Any, Any]:
    """One statement as steps (what the claims' runners take)."""
    return (yield op, params)


class IdempotencyStore:
    """The idempotency keys of one store, and the claims this process holds.

    The statements are built once, with bound parameters: building a SQLAlchemy statement per call costs more
    than running it (docs/benchmarks.md, "Tenancy cost per request")."""

    def __init__(self, store: Store, *, ttl_s: float = 86_400.0, lease_s: float = 60.0,
                 clock: Callable[[], dt.datetime] | None = None) -> None:
        if ttl_s <= 0 or lease_s <= 0:
            raise ValueError("the TTL and the lease must be positive")
        self.store = store
        url = store.url
        in_memory = store.is_sqlite and url.database in (None, "", ":memory:")  # one database per connection
        # an in-memory database is one shared connection (the store's); elsewhere an autocommit engine of its own
        self._own: Engine | None = None if in_memory else make_engine(url, relaxed=True)
        self._engine: Engine = store.engine if self._own is None else self._own
        self._insert = _insert_unless_there(self._engine.dialect.name)
        # claims on the event loop, where they need not block it, run the same statements on connections of their
        # own: a SQLite file's when its write lock is free (sqlite_claims.py), Postgres's asynchronous ones
        # (pg_claims.py)
        self._lite: SqliteClaims | None = None
        self._pg: PgClaims | None = None
        if self._insert is not None:
            claim_statements: dict[str, tuple[ClauseElement, list[str]]] = {
                "insert": (cast(ClauseElement, self._insert), ["scope", "key", *_FRESH]), "read": (_READ, []),
                "take_over": (_TAKE_OVER, list(_FRESH)), "complete": (_COMPLETE, list(_ANSWER))}
            if store.is_sqlite and not in_memory and url.database:
                self._lite = SqliteClaims(url.database, claim_statements, _set_up_quick)
            elif self._engine.dialect.name == "postgresql":
                self._pg = PgClaims(url, self._engine.dialect, claim_statements)
        self.ttl = dt.timedelta(seconds=ttl_s)
        self.lease = dt.timedelta(seconds=lease_s)
        self._clock = clock or store.now
        self._held: dict[str, tuple[str, str]] = {}  # owner -> (scope, key): this process's running claims
        self._answers: dict[tuple[str, str], tuple[str, StoredAnswer]] = {}  # remembered, being written
        self._lock = threading.Lock()

    @property
    def held(self) -> int:
        """Claims this process holds now (work running)."""
        with self._lock:
            return len(self._held)

    def claim(self, scope: str, key: str, route: str, fingerprint: str) -> Claim:
        """Claim `key` for the request with `fingerprint`, or say why not (module doc)."""
        return self._retrying(lambda: self._claim(scope, key, route, fingerprint))

    def claim_at_once(self, scope: str, key: str, route: str, fingerprint: str) -> Claim | None:
        """The claim without waiting, for a caller on the event loop: on a SQLite file whose write lock is free
        (an insert of ~0.05 ms on sqlite3 directly, no thread hop, which costs more than the statement); None where it
        would wait (another writer holds the lock; Postgres, a round trip away), and the caller runs `claim()`
        in a thread. Nothing is changed when it returns None."""
        if self._lite is None:
            return None
        try:
            return cast(Claim, self._lite.run(self._claim_steps(scope, key, route, fingerprint)))
        except Busy:
            return None

    async def claim_here(self, scope: str, key: str, route: str, fingerprint: str) -> Claim | None:
        """The claim on the caller's event loop, where it need not block it: a SQLite file's when its write
        lock is free (`claim_at_once`), Postgres's on asynchronous connections (pg_claims.py, a dropped one
        retried once); None otherwise, and the caller runs `claim()` in a thread."""
        if self._lite is not None:
            return self.claim_at_once(scope, key, route, fingerprint)
        if self._pg is None or not self._pg.usable():
            return None
        try:
            return cast(Claim, await self._pg.run(self._claim_steps(scope, key, route, fingerprint)))
        except PgOperationalError:
            return cast(Claim, await self._pg.run(self._claim_steps(scope, key, route, fingerprint)))

    async def aclose(self) -> None:
        """Close the event loop's asynchronous connections, then the rest (`close`)."""
        if self._pg is not None:
            await self._pg.close()
        self.close()

    def remember(self, scope: str, key: str, fingerprint: str, answer: StoredAnswer) -> None:
        """Keep a held claim's answer in this process until `complete()` has written it: a retry that reaches
        this process in between is replayed from memory (another process sees the claim running: 409)."""
        with self._lock:
            self._answers[(scope, key)] = (fingerprint, answer)

    def _claim(self, scope: str, key: str, route: str, fingerprint: str) -> Claim:
        """The claim's steps (`_claim_steps`) run on one connection of the thread's engine."""
        steps = self._claim_steps(scope, key, route, fingerprint)
        with self._connection() as conn:
            try:
                op, params = next(steps)
                while True:
                    if op == "insert":
                        result: Any = self._inserted(conn, params)
                    elif op == "read":
                        result = conn.execute(_READ, params).one_or_none()
                    else:
                        result = _rows(conn.execute(_TAKE_OVER, params))
                    op, params = steps.send(result)
            except StopIteration as done:
                return cast(Claim, done.value)

    def _claim_steps(self, scope: str, key: str, route: str, fingerprint: str) -> ClaimSteps:
        """The claim as a sequence of statements, apart from how they run (a thread's connection, or an
        asynchronous one): yields ("insert", row) for True when it landed, ("read", params) for the row or
        None, ("take_over", params) for the rows changed; returns the claim."""
        with self._lock:
            remembered = self._answers.get((scope, key))
        if remembered is not None:
            same = remembered[0] == fingerprint
            return Claim(ClaimState.REPLAY, answer=remembered[1]) if same else Claim(ClaimState.MISMATCH)
        owner = secrets.token_hex(16)
        this = {"b_scope": scope, "b_key": key}
        for _ in range(8):  # each round ends unless another request changed the row in between
            now = self._clock()
            fresh = dict(zip(_FRESH, (route[:64], fingerprint, owner, now, now + self.lease, now + self.ttl,
                                      None, None, None), strict=True))
            if (yield "insert", {"scope": scope, "key": key, **fresh}):
                return self._hold(owner, scope, key)
            row = yield "read", this
            if row is None:
                continue  # deleted (pruned) since the insert met it: insert again
            expires_at = _utc(row.expires_at)
            same = row.fingerprint == fingerprint
            if expires_at > now and not same:
                return Claim(ClaimState.MISMATCH)
            if expires_at > now and row.status is not None:
                answer = StoredAnswer(row.status, json.loads(row.headers or "{}"), bytes(row.body or b""))
                return Claim(ClaimState.REPLAY, answer=answer)
            if expires_at > now and _utc(row.locked_until) > now:
                return Claim(ClaimState.IN_USE)
            # expired, or an abandoned claim of this same request: take it over, if nobody else did first
            if (yield "take_over", {**this, "b_owner": row.owner, **fresh}) == 1:
                if expires_at > now:
                    log.warning("idempotency key of %s: took over a claim abandoned by its holder",
                                scope or "(no key)")
                return self._hold(owner, scope, key)
        return Claim(ClaimState.IN_USE)  # lost every race: the client retries after Retry-After

    def complete(self, scope: str, key: str, owner: str, answer: StoredAnswer) -> bool:
        """Store the answer of the holder's claim; False when the claim is no longer its own."""
        params = self._answer(scope, key, owner, answer)
        try:
            return self._retrying(lambda: self._write(_COMPLETE, params)) == 1
        finally:
            self._forget(scope, key, owner)

    def complete_at_once(self, scope: str, key: str, owner: str, answer: StoredAnswer) -> bool | None:
        """`complete` without waiting, for a caller on the event loop: on a SQLite file whose write lock is
        free (one update of ~0.05 ms, cheaper than the thread hop, and no thread left holding the GIL while the
        client reads its answer); None where it would wait, and the caller runs `complete()` in a thread."""
        if self._lite is None:
            return None
        try:
            done = bool(self._lite.run(_one("complete", self._answer(scope, key, owner, answer))) == 1)
        except Busy:
            return None  # nothing written; `complete()` follows
        except BaseException:
            self._forget(scope, key, owner)
            raise
        self._forget(scope, key, owner)
        return done

    async def complete_here(self, scope: str, key: str, owner: str, answer: StoredAnswer) -> bool | None:
        """`complete` on the caller's event loop, where it need not block it (as `claim_here`): no thread left
        holding the GIL while the client reads its answer. None where it cannot, and the caller runs
        `complete()` in a thread."""
        if self._lite is not None:
            return self.complete_at_once(scope, key, owner, answer)
        if self._pg is None or not self._pg.usable():
            return None
        params = self._answer(scope, key, owner, answer)
        try:
            try:
                rows = await self._pg.run(_one("complete", params))
            except PgOperationalError:  # a dropped connection: once more
                rows = await self._pg.run(_one("complete", params))
        finally:
            self._forget(scope, key, owner)
        return bool(rows == 1)

    def _answer(self, scope: str, key: str, owner: str, answer: StoredAnswer) -> dict[str, Any]:
        return {"b_scope": scope, "b_key": key, "b_owner": owner, "status": answer.status,
                "headers": json.dumps(answer.headers), "body": answer.body, "locked_until": self._clock()}

    def _forget(self, scope: str, key: str, owner: str) -> None:
        self._drop(owner)
        with self._lock:
            self._answers.pop((scope, key), None)

    def release(self, scope: str, key: str, owner: str) -> bool:
        """Give the key up without an answer (the next request with it runs); False when it was not held."""
        try:
            return self._retrying(lambda: self._write(_RELEASE, {"b_scope": scope, "b_key": key,
                                                                  "b_owner": owner})) == 1
        finally:
            self._forget(scope, key, owner)

    def renew(self) -> int:
        """Extend the lease of every claim this process holds (one statement); returns how many."""
        with self._lock:
            owners = list(self._held)
        if not owners:
            return 0
        stmt = (update(TABLE).where(C.owner.in_(owners), C.status.is_(None))
                .values(locked_until=self._clock() + self.lease))
        return self._retrying(lambda: self._write(stmt, {}))

    def prune(self, max_batches: int = 100, batch: int = PRUNE_BATCH) -> int:
        """Delete expired rows, about `batch` at a time (each batch its own transaction, so no long lock);
        returns how many."""
        total = 0
        for _ in range(max_batches):
            now = self._clock()
            with self._connection() as conn:
                cut = conn.execute(select(C.expires_at).where(C.expires_at <= now).order_by(C.expires_at)
                                   .offset(batch - 1).limit(1)).scalar_one_or_none()
                n = _rows(conn.execute(delete(TABLE).where(C.expires_at <= (cut or now))))
            total += n
            if cut is None:
                break
        return total

    def close(self) -> None:
        """Close this store's own connections (the shared store stays open)."""
        if self._own is not None:
            self._own.dispose()
        if self._lite is not None:
            self._lite.close()

    def _retrying(self, op: Callable[[], T]) -> T:
        """`op`, again once if its connection had dropped (connections are not pinged before use)."""
        try:
            return op()
        except DBAPIError as exc:
            if not exc.connection_invalidated:
                raise
            return op()

    def _inserted(self, conn: Connection, row: dict[str, Any]) -> bool:
        """The claim's insert (the first statement of its round); True when it landed."""
        if self._insert is not None:
            return conn.execute(self._insert, row).first() is not None
        try:
            conn.execute(insert(TABLE), row)
        except IntegrityError:
            conn.rollback()  # nothing else happened on this connection yet
            return False
        return True

    @contextmanager
    def _connection(self, engine: Engine | None = None) -> Iterator[Connection]:
        """A connection; what it did is committed when the block ends (a no-op under autocommit)."""
        with (engine or self._engine).connect() as conn:
            yield conn
            conn.commit()

    def _write(self, stmt: Executable, params: dict[str, Any]) -> int:
        with self._connection() as conn:
            return _rows(conn.execute(stmt, params))

    def _hold(self, owner: str, scope: str, key: str) -> Claim:
        with self._lock:
            self._held[owner] = (scope, key)
        return Claim(ClaimState.CLAIMED, owner=owner)

    def _drop(self, owner: str) -> None:
        with self._lock:
            self._held.pop(owner, None)


async def maintain(idem: IdempotencyStore, *, prune_every_s: float) -> None:
    """Until cancelled: renew this process's claims every third of the lease, prune expired rows every
    `prune_every_s` (the first time a third of a lease after start). A failure is logged and tried again."""
    every = idem.lease.total_seconds() / 3
    last_prune = -float("inf")
    while True:
        await asyncio.sleep(every)
        try:
            if idem.held:
                await asyncio.to_thread(idem.renew)
            if time.monotonic() - last_prune >= prune_every_s:
                last_prune = time.monotonic()
                pruned = await asyncio.to_thread(idem.prune)
                if pruned:
                    log.info("pruned %d expired idempotency keys", pruned)
        except Exception as exc:
            log.warning("idempotency keys: renewing or pruning failed (%s); trying again in %.0fs",
                        type(exc).__name__, every)


__all__ = ["Claim", "ClaimState", "IdempotencyStore", "StoredAnswer", "maintain"]
