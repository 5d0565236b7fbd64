"""Item leases: taking items, renewing and handing them back, and writing each result once.

Leasing takes open items (pending, or leased with an expired lease) line by line across jobs (every job's
first line, then every job's second, the older job first within a line: a small job submitted behind a large
one finishes without waiting for it), in one statement that marks them leased by the caller until
`lease_until`: on Postgres `UPDATE ... WHERE id IN (SELECT ... FOR UPDATE SKIP LOCKED)`, so replicas never
wait on each other's rows and never take the same one; on SQLite the same UPDATE without the locking clause,
which SQLite runs under its single database write lock (one writer at a time: the equivalent). A result is
written by `finish_item` only where the row is still leased by the caller (a conditional UPDATE): a worker
whose lease was taken over writes nothing, so each item's result is written exactly once (`result_writes`
counts the writes, `finished_by` names the writer).
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import select, update

from sluicegate.jobs import states as S
from sluicegate.store.db import Store
from sluicegate.store.models import BatchItem
from sluicegate.store.notify import JOBS, announce


@dataclass(frozen=True, slots=True)
class Lease:
    id: int
    job_id: str
    line: int
    custom_id: str | None
    body: str | None
    attempts: int


class Leases:
    def __init__(self, store: Store) -> None:
        self.store = store

    def lease(self, owner: str, n: int, lease_s: float) -> list[Lease]:
        now = self.store.now()
        i = BatchItem
        sub = select(i.id).where((i.state == S.PENDING) | ((i.state == S.LEASED) & (i.lease_until < now)))
        sub = sub.order_by(i.line, i.id).limit(n)  # round robin across jobs: each job's next line in turn
        if not self.store.is_sqlite:
            sub = sub.with_for_update(skip_locked=True)
        stmt = (update(i).where(i.id.in_(sub.scalar_subquery()))
                .values(state=S.LEASED, owner=owner, lease_until=now + dt.timedelta(seconds=lease_s),
                        attempts=i.attempts + 1)
                .returning(i.id, i.job_id, i.line, i.custom_id, i.body, i.attempts))
        with self.store.session() as s, s.begin():
            rows = s.execute(stmt).all()
        return sorted((Lease(*r) for r in rows), key=lambda x: x.id)

    def renew(self, owner: str, ids: Sequence[int], lease_s: float) -> None:
        if not ids:
            return
        with self.store.session() as s, s.begin():
            s.execute(update(BatchItem).where(BatchItem.id.in_(ids), BatchItem.owner == owner,
                                              BatchItem.state == S.LEASED)
                      .values(lease_until=self.store.now() + dt.timedelta(seconds=lease_s)))

    def release(self, owner: str) -> int:
        """Hand every lease of `owner` back (pending again, at once): a replica shutting down."""
        with self.store.session() as s, s.begin():
            res = s.execute(update(BatchItem).where(BatchItem.owner == owner, BatchItem.state == S.LEASED)
                            .values(state=S.PENDING, owner=None, lease_until=None, attempts=BatchItem.attempts - 1))
            if res.rowcount:  # type: ignore[attr-defined]
                announce(s, JOBS)  # another replica starts them at once
        return int(res.rowcount or 0)  # type: ignore[attr-defined]

    def release_item(self, owner: str, item_id: int) -> None:
        """One lease handed back (the item could not run now: the engine was full or stopping)."""
        with self.store.session() as s, s.begin():
            s.execute(update(BatchItem).where(BatchItem.id == item_id, BatchItem.owner == owner,
                                              BatchItem.state == S.LEASED)
                      .values(state=S.PENDING, owner=None, lease_until=None, attempts=BatchItem.attempts - 1))

    def finish_item(self, owner: str, item_id: int, state: str, status_code: int | None, result: Any,
                    prompt_tokens: int = 0, completion_tokens: int = 0) -> bool:
        """Write the item's result if the caller still holds its lease; False: it does not (nothing written)."""
        with self.store.session() as s, s.begin():
            res = s.execute(update(BatchItem).where(
                BatchItem.id == item_id, BatchItem.owner == owner, BatchItem.state == S.LEASED).values(
                state=state, owner=None, lease_until=None, status_code=status_code,
                result=None if result is None else json.dumps(result), prompt_tokens=prompt_tokens,
                completion_tokens=completion_tokens, finished_at=self.store.now(), finished_by=owner,
                result_writes=BatchItem.result_writes + 1))
        return bool(res.rowcount)  # type: ignore[attr-defined]
