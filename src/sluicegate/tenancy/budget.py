"""A monthly token budget per API key: tokens (prompt + generated) per calendar month, UTC.

The count is the usage ledger's (the same rows `GET /v1/usage` sums), so every replica sharing the store counts
every replica's usage, and a restart forgets nothing. A request reserves its cost estimate at admission (as
against the token bucket) and is refused when the month's usage, plus what this process has admitted and not
yet seen in the ledger, plus the cost, would pass the budget; when it ends, what it really used replaces the
reservation.

The month's sum is read from the store at most every `refresh_s` per key (off the event loop; one indexed
query), and what this process settled since is added, so the check is exact for one replica. Across replicas
the count lags by at most `refresh_s` plus the ledger's write delay: a key spending fast on several replicas at
once can pass its budget by what it uses in those seconds, never more; a budget is a monthly cap, not a rate.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from sqlalchemy import func, select

from sluicegate.store.db import Store
from sluicegate.store.models import UsageRecord


def month_start(now: dt.datetime) -> dt.datetime:
    return now.astimezone(dt.UTC).replace(day=1, hour=0, minute=0, second=0, microsecond=0)


def next_month(now: dt.datetime) -> dt.datetime:
    start = month_start(now)
    return (start + dt.timedelta(days=32)).replace(day=1)


def month_usage(store: Store, key_id: str, since: dt.datetime) -> int:
    """Tokens (prompt + generated) the ledger holds for the key since `since` (a month's first day)."""
    with store.session() as s:
        total = s.scalar(select(func.coalesce(func.sum(UsageRecord.prompt_tokens + UsageRecord.generated_tokens), 0))
                         .where(UsageRecord.key_id == key_id, UsageRecord.day >= since.date()))
    return int(total or 0)


@dataclass(frozen=True, slots=True)
class BudgetDecision:
    allowed: bool
    used: int  # this month's tokens as counted now (before this request)
    budget: int
    resets_at: dt.datetime  # the next month's first instant, UTC

    def reset_in_s(self, now: dt.datetime | None = None) -> int:
        return max(1, int((self.resets_at - (now or dt.datetime.now(dt.UTC))).total_seconds()) + 1)


@dataclass(slots=True)
class _Count:
    month: dt.datetime
    ledger: int = 0  # the store's sum at the last read
    read_at: float = -1e18  # monotonic
    since: int = 0  # settled here after that read began
    reserved: int = 0  # admitted here, not yet settled
    reading: asyncio.Future[None] | None = field(default=None)


class MonthlyBudgets:
    def __init__(self, store: Store, *, refresh_s: float = 5.0, clock: Callable[[], float] = time.monotonic,
                 now: Callable[[], dt.datetime] = lambda: dt.datetime.now(dt.UTC)) -> None:
        self.store = store
        self.refresh_s = refresh_s
        self._clock = clock
        self._now = now
        self._counts: dict[str, _Count] = {}

    async def _current(self, key_id: str) -> _Count:
        month = month_start(self._now())
        c = self._counts.get(key_id)
        if c is None or c.month != month:
            c = self._counts[key_id] = _Count(month)
        if self._clock() - c.read_at >= self.refresh_s:
            if c.reading is None:  # one read per key at a time; others wait for it
                c.reading = asyncio.ensure_future(self._read(key_id, c))
            reading = c.reading
            await asyncio.shield(reading)
        return c

    async def _read(self, key_id: str, c: _Count) -> None:
        started, since_before = self._clock(), c.since
        try:
            c.ledger = await asyncio.to_thread(month_usage, self.store, key_id, c.month)
            c.read_at = started
            c.since -= since_before  # what was settled before the read began is in the ledger now (or soon)
        finally:
            c.reading = None

    async def reserve(self, key_id: str, budget: int, cost: int) -> BudgetDecision:
        """Admit `cost` tokens against the month's budget, or refuse (nothing reserved)."""
        c = await self._current(key_id)
        used = c.ledger + c.since + c.reserved
        resets = next_month(c.month)
        if used + cost > budget:
            return BudgetDecision(False, used, budget, resets)
        c.reserved += cost
        return BudgetDecision(True, used, budget, resets)

    def settle(self, key_id: str, reserved: int, actual: int) -> None:
        """The request ended having used `actual` tokens of its `reserved`."""
        c = self._counts.get(key_id)
        if c is None:
            return
        c.reserved = max(0, c.reserved - reserved)
        c.since += actual


__all__ = ["BudgetDecision", "MonthlyBudgets", "month_start", "month_usage", "next_month"]
