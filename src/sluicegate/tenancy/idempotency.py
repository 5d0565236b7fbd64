"""Idempotency keys in the store: claim a key, store its answer or release it, replay, leases and expiry.

The store side of the IETF Idempotency-Key draft as Stripe runs it (docs/idempotency.md). Nothing here knows
HTTP: api/idempotency.py puts it on the routes. Every method is synchronous (SQLAlchemy); callers on the event
loop run them in a worker thread.

- `claim()` inserts the row (scope, key) holding the request's fingerprint, unless one exists. The primary key
  is the unique constraint that decides between two requests claiming one key at once, in one process or on
  two replicas sharing the database: the insert that lands runs the work. The other reads the row: another
  fingerprint is `MISMATCH`; no answer yet is `IN_USE` (while the claim's lease holds); an answer is `REPLAY`.
  A row past its expiry is as good as absent (claimed anew in place), and so is a claim whose lease ran out
  with the same fingerprint (its process died): the work runs again, once.
- The holder ends its claim with `complete()` (the answer to replay) or `release()` (nothing kept: the request
  was refused before it ran, or its client was told to retry). Both touch only the holder's own claim
  (`owner`, a random token), so a holder whose lease was taken over cannot overwrite the new holder's work.
- While the work runs, `renew()` (every third of the lease, one UPDATE for all of this process's claims)
  keeps the claims alive, so a long generation keeps its key and a crashed process's keys free up within
  one lease.
- Rows expire `ttl_s` after their claim; `prune()` deletes expired rows in bounded batches (each replica runs
  it now and then; a claim meeting an expired row replaces it itself, so pruning only bounds the table).

Timestamps come from each process's clock: replicas whose clocks differ by seconds shift a 60 s lease or a
24 h expiry by as much, which changes nothing a client can rely on.
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
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

from sqlalchemy import CursorResult, Insert, Result, delete, insert, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from sluicegate.store.db import Store
from sluicegate.store.models import IdempotencyRecord

log = logging.getLogger("sluicegate.idempotency")

PRUNE_BATCH = 1000  # most expired rows one prune transaction deletes (ties on the cut-off may add a few)
Rec = IdempotencyRecord


class Outcome(enum.Enum):
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
    outcome: Outcome
    owner: str = ""  # CLAIMED: the token complete() and release() need
    answer: StoredAnswer | None = None  # REPLAY: what to send


def _rows(result: Result[Any]) -> int:
    """Rows an INSERT, UPDATE or DELETE touched."""
    return int(cast(CursorResult[Any], result).rowcount)


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


class IdempotencyStore:
    """The idempotency keys of one store, and the claims this process holds."""

    def __init__(self, store: Store, *, ttl_s: float = 86_400.0, lease_s: float = 60.0,
                 clock: Callable[[], dt.datetime] = _now) -> None:
        if ttl_s <= 0 or lease_s <= 0:
            raise ValueError("the TTL and the lease must be positive")
        self.store = store
        self.ttl = dt.timedelta(seconds=ttl_s)
        self.lease = dt.timedelta(seconds=lease_s)
        self._clock = clock
        self._held: dict[str, tuple[str, str]] = {}  # owner -> (scope, key): this process's running claims
        self._lock = threading.Lock()

    @property
    def held(self) -> int:
        """Claims this process holds now (work running)."""
        with self._lock:
            return len(self._held)

    def claim(self, scope: str, key: str, route: str, fingerprint: str) -> Claim:
        """Claim `key` for the request with `fingerprint`, or say why not (module doc)."""
        owner = secrets.token_hex(16)
        for _ in range(8):  # each round ends unless another request changed the row in between
            now = self._clock()
            fresh = {"route": route[:64], "fingerprint": fingerprint, "owner": owner, "created_at": now,
                     "locked_until": now + self.lease, "expires_at": now + self.ttl, "status": None,
                     "headers": None, "body": None}
            with self.store.session() as s, s.begin():
                if self._insert(s, {"scope": scope, "key": key, **fresh}):
                    return self._hold(owner, scope, key)
                row = s.execute(select(Rec).where(Rec.scope == scope, Rec.key == key)).scalar_one_or_none()
                if row is None:
                    continue  # deleted (pruned) since the insert met it: insert again
                same = row.fingerprint == fingerprint
                if row.expires_at > now and not same:
                    return Claim(Outcome.MISMATCH)
                if row.expires_at > now and row.status is not None:
                    answer = StoredAnswer(row.status, json.loads(row.headers or "{}"), row.body or b"")
                    return Claim(Outcome.REPLAY, answer=answer)
                if row.expires_at > now and row.locked_until > now:
                    return Claim(Outcome.IN_USE)
                # expired, or an abandoned claim of this same request: take it over, if nobody else did first
                taken = _rows(s.execute(update(Rec).where(Rec.scope == scope, Rec.key == key,
                                                          Rec.owner == row.owner).values(**fresh)))
                if taken == 1:
                    if row.expires_at > now:
                        log.warning("idempotency key of %s: took over a claim abandoned by its holder",
                                    scope or "(no key)")
                    return self._hold(owner, scope, key)
        return Claim(Outcome.IN_USE)  # lost every race: the client retries after Retry-After

    def complete(self, scope: str, key: str, owner: str, answer: StoredAnswer) -> bool:
        """Store the answer of the holder's claim; False when the claim is no longer its own."""
        try:
            with self.store.session() as s, s.begin():
                done = _rows(s.execute(
                    update(Rec).where(Rec.scope == scope, Rec.key == key, Rec.owner == owner, Rec.status.is_(None))
                    .values(status=answer.status, headers=json.dumps(answer.headers), body=answer.body,
                            locked_until=self._clock())
                ))
        finally:
            self._drop(owner)
        return done == 1

    def release(self, scope: str, key: str, owner: str) -> bool:
        """Give the key up without an answer (the next request with it runs); False when it was not held."""
        try:
            with self.store.session() as s, s.begin():
                gone = _rows(s.execute(delete(Rec).where(Rec.scope == scope, Rec.key == key, Rec.owner == owner,
                                                         Rec.status.is_(None))))
        finally:
            self._drop(owner)
        return gone == 1

    def renew(self) -> int:
        """Extend the lease of every claim this process holds (one statement); returns how many."""
        with self._lock:
            owners = list(self._held)
        if not owners:
            return 0
        with self.store.session() as s, s.begin():
            return _rows(s.execute(update(Rec).where(Rec.owner.in_(owners), Rec.status.is_(None))
                                   .values(locked_until=self._clock() + self.lease)))

    def prune(self, max_batches: int = 100, batch: int = PRUNE_BATCH) -> int:
        """Delete expired rows, about `batch` at a time (each batch its own transaction, so no long lock);
        returns how many."""
        total = 0
        for _ in range(max_batches):
            now = self._clock()
            with self.store.session() as s, s.begin():
                cut = s.execute(select(Rec.expires_at).where(Rec.expires_at <= now).order_by(Rec.expires_at)
                                .offset(batch - 1).limit(1)).scalar_one_or_none()
                n = _rows(s.execute(delete(Rec).where(Rec.expires_at <= (cut or now))))
            total += n
            if cut is None:
                break
        return total

    def _insert(self, s: Session, values: dict[str, Any]) -> bool:
        """Insert the row unless the key exists; True when this insert landed."""
        dialect = s.get_bind().dialect.name
        stmt: Insert
        if dialect == "postgresql":
            from sqlalchemy.dialects.postgresql import insert as pg_insert

            stmt = pg_insert(Rec).values(**values).on_conflict_do_nothing()
        elif dialect == "sqlite":
            from sqlalchemy.dialects.sqlite import insert as sqlite_insert

            stmt = sqlite_insert(Rec).values(**values).on_conflict_do_nothing()
        else:  # any other database: the constraint refuses the second insert
            try:
                with s.begin_nested():
                    s.execute(insert(Rec).values(**values))
            except IntegrityError:
                return False
            return True
        return s.execute(stmt.returning(Rec.owner)).first() is not None  # (psycopg's rowcount here is -1)

    def _hold(self, owner: str, scope: str, key: str) -> Claim:
        with self._lock:
            self._held[owner] = (scope, key)
        return Claim(Outcome.CLAIMED, owner=owner)

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


__all__ = ["Claim", "IdempotencyStore", "Outcome", "StoredAnswer", "maintain"]
