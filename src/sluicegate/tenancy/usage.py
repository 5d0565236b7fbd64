"""The usage ledger: one row per metered request, written by a background thread, read back by day.

`record()` is called when a request ends (on the event loop): it appends to an in-memory queue and wakes the
writer, and never waits for the store. The writer thread inserts whatever has gathered in one transaction
(so under load rows are batched by themselves), and retries after a failure with the rows kept, up to
`max_pending` rows; past that the oldest are dropped and the loss is logged, so a dead database cannot grow
the server's memory without bound. `flush()` waits until every row recorded before it is written: the
usage endpoint calls it (in a thread) so a caller always sees its own finished requests.
"""

from __future__ import annotations

import datetime as dt
import logging
import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import Any

from sqlalchemy import case, func, insert, select
from sqlalchemy.exc import DataError, IntegrityError

from sluicegate.store.db import Store
from sluicegate.store.models import UsageRecord

log = logging.getLogger("sluicegate.usage")
BATCH_ROWS = 1000  # most rows in one insert transaction


@dataclass(frozen=True, slots=True)
class DayTotals:
    key_id: str | None
    day: dt.date
    requests: int
    failed_requests: int  # status 400 and above (499: the client left)
    prompt_tokens: int
    cached_tokens: int
    generated_tokens: int


class UsageLedger:
    def __init__(self, store: Store, *, max_pending: int = 100_000, retry_s: float = 1.0) -> None:
        self.store = store
        self.max_pending = max_pending
        self.retry_s = retry_s
        self._pending: deque[dict[str, Any]] = deque()
        self._cond = threading.Condition()
        self._recorded = 0  # rows handed to record(), ever
        self._written = 0  # rows written (or dropped), ever: flush waits for it to catch up
        self._dropped = 0
        self._closing = False
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        if self._thread is None:
            self._closing = False
            self._thread = threading.Thread(target=self._run, name="sluicegate-usage", daemon=True)
            self._thread.start()

    def record(
        self,
        key_id: str | None,
        route: str,
        prompt_tokens: int,
        cached_tokens: int,
        generated_tokens: int,
        status: int,
        *,
        request_id: str = "",
    ) -> None:
        """Queue one request's usage; returns at once (the writer thread stores it)."""
        now = dt.datetime.now(dt.UTC)
        row = {
            "key_id": key_id, "day": now.date(), "route": route[:64], "status": status,
            "prompt_tokens": prompt_tokens, "cached_tokens": cached_tokens, "generated_tokens": generated_tokens,
            "request_id": request_id[:128], "created_at": now,
        }
        with self._cond:
            self._pending.append(row)
            self._recorded += 1
            self._trim()
            self._cond.notify()

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._pending and not self._closing:
                    self._cond.wait()
                if not self._pending and self._closing:
                    return
                batch = self._take()
            try:
                try:
                    self._insert(batch)
                    written = len(batch)
                except (IntegrityError, DataError):
                    written = self._insert_each(batch)  # the store works, some row does not: keep the rest
            except Exception:
                log.exception("usage ledger: writing %d rows failed; retrying in %.1fs", len(batch), self.retry_s)
                with self._cond:
                    self._pending.extendleft(reversed(batch))
                    self._trim()
                    if self._closing:
                        return
                    self._cond.wait(self.retry_s)
                continue
            with self._cond:
                self._written += written
                self._cond.notify_all()

    def _take(self) -> list[dict[str, Any]]:
        return [self._pending.popleft() for _ in range(min(len(self._pending), BATCH_ROWS))]

    def _insert(self, batch: list[dict[str, Any]]) -> None:
        with self.store.session() as s, s.begin():
            s.execute(insert(UsageRecord), batch)

    def _insert_each(self, batch: list[dict[str, Any]]) -> int:
        """Row by row, dropping (and logging) the rows the store refuses, so one bad row cannot block the
        ledger. Any other failure propagates with the batch intact (it is retried whole; a row written twice
        is the price of an outage in the middle of this, which is rarer than the bad row that led here)."""
        refused = 0
        for row in batch:
            try:
                self._insert([row])
            except (IntegrityError, DataError):
                refused += 1
        log.error("usage ledger: the store refused %d of %d rows (dropped)", refused, len(batch))
        return len(batch)

    def _trim(self) -> None:
        """Drop the oldest rows past `max_pending` (counted as written, so flush does not wait for them)."""
        while len(self._pending) > self.max_pending:
            self._pending.popleft()
            self._dropped += 1
            self._written += 1
            if self._dropped == 1 or self._dropped % 1000 == 0:
                log.error("usage ledger: the store is not taking rows; %d dropped so far", self._dropped)

    def flush(self, timeout: float = 10.0) -> bool:
        """Wait until every row recorded so far is written; False if that took longer than `timeout`.

        Without a writer thread (never started, or closed) the rows are written in the calling thread.
        """
        deadline = time.monotonic() + timeout
        with self._cond:
            target = self._recorded
            if self._thread is None:
                batch = list(self._pending)
                self._pending.clear()
            else:
                while self._written < target:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        return False
                    self._cond.wait(left)
                return True
        if batch:
            self._insert(batch)
        with self._cond:
            self._written += len(batch)
        return True

    def unwritten(self, key_id: str | None = None, *, all_keys: bool = False) -> int:
        """Rows recorded in this process and not yet in the store: one key's (None: auth off), or every key's."""
        with self._cond:
            return sum(1 for row in self._pending if all_keys or row["key_id"] == key_id)

    def close(self, timeout: float = 10.0) -> None:
        """Write what is pending (waiting up to `timeout`), then stop the writer."""
        thread = self._thread
        if thread is None:
            return
        self.flush(timeout)
        with self._cond:
            self._closing = True
            self._cond.notify_all()
        thread.join(timeout)
        self._thread = None

    def totals(self, key_id: str | None = None, *, all_keys: bool = False) -> list[DayTotals]:
        """Totals by day for one key (`key_id`; None: requests made while auth was off), or for every key."""
        u = UsageRecord
        q = select(
            u.key_id, u.day, func.count(), func.sum(case((u.status >= 400, 1), else_=0)),
            func.sum(u.prompt_tokens), func.sum(u.cached_tokens), func.sum(u.generated_tokens),
        ).group_by(u.key_id, u.day)
        if not all_keys:
            q = q.where(u.key_id.is_(None) if key_id is None else u.key_id == key_id)
        with self.store.session() as s:
            rows = s.execute(q).all()
        out = [DayTotals(k, d, int(n), int(f or 0), int(p or 0), int(c or 0), int(g or 0))
               for k, d, n, f, p, c, g in rows]
        out.sort(key=lambda t: (t.day, t.key_id or ""))
        return out


__all__ = ["DayTotals", "UsageLedger"]
