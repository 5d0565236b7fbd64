"""Serialising the transactions that check a per-key limit and then write within it (count, then insert).

Two replicas that count a key's rows and insert one each, at once, both see the count below the limit: the
check must run under a lock every such transaction takes. `lock_key` takes it:

- Postgres: a transaction-level advisory lock on (scope, key) (`pg_advisory_xact_lock`), held until the
  transaction ends; other keys, and other scopes of the same key, never wait on it.
- SQLite: one writer at a time for the whole database, so nothing to take here, provided the transaction's
  first statement writes (its write lock is then held from that statement to the commit, and what it reads
  afterwards is the latest state): callers write first, then count, and roll back when over the limit.
"""

from __future__ import annotations

from sqlalchemy import text
from sqlalchemy.orm import Session


def lock_key(s: Session, scope: str, key_id: str | None) -> None:
    """Take the (scope, key) lock for the rest of the session's transaction (see the module doc)."""
    if s.get_bind().dialect.name == "postgresql":
        s.execute(text("SELECT pg_advisory_xact_lock(hashtextextended(:k, 0))"), {"k": f"{scope}:{key_id or ''}"})
