"""A monthly token budget per key, counted from the usage ledger (every replica's rows), per calendar month."""

from __future__ import annotations

import asyncio
import datetime as dt
from pathlib import Path

from sluicegate.store.db import Store
from sluicegate.store.migrate import upgrade
from sluicegate.tenancy.budget import MonthlyBudgets, next_month
from sluicegate.tenancy.keys import create_key
from sluicegate.tenancy.usage import UsageLedger
from tests.dbs import sqlite_url


def test_reserve_settle_and_the_ledgers_rows(tmp_path: Path) -> None:
    url = sqlite_url(tmp_path)
    upgrade(url)
    store = Store.open(url)
    key, _ = create_key(store, "k")
    ledger = UsageLedger(store)
    ledger.start()
    clock = [0.0]
    now = dt.datetime(2026, 12, 3, tzinfo=dt.UTC)
    budgets = MonthlyBudgets(store, refresh_s=5.0, clock=lambda: clock[0], now=lambda: now)
    try:
        async def main() -> None:
            d = await budgets.reserve(key.id, 1000, 600)
            assert d.allowed and d.used == 0 and d.resets_at == dt.datetime(2027, 1, 1, tzinfo=dt.UTC)
            refused = await budgets.reserve(key.id, 1000, 500)  # 600 reserved: 1100 would pass it
            assert not refused.allowed and refused.used == 600
            budgets.settle(key.id, 600, 250)  # it used less than it reserved
            assert (await budgets.reserve(key.id, 1000, 700)).allowed  # 250 + 700
            budgets.settle(key.id, 700, 700)
            assert not (await budgets.reserve(key.id, 1000, 100)).allowed  # 950 used
            # another replica's usage, seen through the ledger at the next read
            ledger.record(key.id, "/v1/generate", 5000, 0, 0, 200, request_id="req_other")
            assert ledger.flush()
            clock[0] = 10.0
            d = await budgets.reserve(key.id, 100_000, 1)
            assert d.used >= 5000

        asyncio.run(main())
    finally:
        ledger.close()
        store.close()


def test_the_month_turns_over() -> None:
    assert next_month(dt.datetime(2026, 12, 31, 23, 59, tzinfo=dt.UTC)) == dt.datetime(2027, 1, 1, tzinfo=dt.UTC)
    assert next_month(dt.datetime(2027, 2, 1, tzinfo=dt.UTC)) == dt.datetime(2027, 3, 1, tzinfo=dt.UTC)
