"""The usage ledger on SQLite and Postgres: rows written off the caller's thread, totals by key and day, rows
kept across a store outage (up to a bound) and written once the store is back."""

from __future__ import annotations

import datetime as dt
import threading

from sluicegate.store.db import Store
from sluicegate.store.migrate import upgrade
from sluicegate.tenancy.keys import create_key
from sluicegate.tenancy.usage import UsageLedger


def test_totals_by_key_and_day(db_url: str) -> None:
    store = Store.open(db_url)
    ledger = UsageLedger(store)
    ledger.start()
    try:
        a, _ = create_key(store, "a")
        b, _ = create_key(store, "b")
        ledger.record(a.id, "/v1/generate", 10, 4, 5, 200, request_id="r1")
        ledger.record(a.id, "/v1/chat/completions", 7, 0, 3, 200)
        ledger.record(a.id, "/v1/generate", 0, 0, 0, 422)
        ledger.record(b.id, "/v1/completions", 2, 0, 9, 499)
        ledger.record(None, "/v1/generate", 1, 0, 1, 200)
        assert ledger.flush()
        today = dt.datetime.now(dt.UTC).date()
        (mine,) = ledger.totals(a.id)
        assert (mine.key_id, mine.day, mine.requests, mine.failed_requests) == (a.id, today, 3, 1)
        assert (mine.prompt_tokens, mine.cached_tokens, mine.generated_tokens) == (17, 4, 8)
        (anon,) = ledger.totals(None)
        assert anon.key_id is None and anon.requests == 1
        every = ledger.totals(all_keys=True)
        assert sorted((t.key_id or "", t.requests) for t in every) == sorted([("", 1), (a.id, 3), (b.id, 1)])
        assert next(t for t in every if t.key_id == b.id).failed_requests == 1
        assert ledger.totals("key_nobody") == []
    finally:
        ledger.close()
        store.close()


def test_record_returns_without_waiting_for_the_store(db_url: str) -> None:
    """While the writer holds the database busy, record() still returns (it only queues)."""
    store = Store.open(db_url)
    ledger = UsageLedger(store)
    ledger.start()
    try:
        key, _ = create_key(store, "a")
        done = threading.Event()

        def many() -> None:
            for i in range(2000):
                ledger.record(key.id, "/v1/generate", i % 7, 0, 1, 200)
            done.set()

        threading.Thread(target=many).start()
        assert done.wait(60)
        assert ledger.flush()
        (t,) = ledger.totals(key.id)
        assert t.requests == 2000 and t.generated_tokens == 2000 and t.prompt_tokens == sum(i % 7 for i in range(2000))
    finally:
        ledger.close()
        store.close()


def test_rows_survive_an_outage_up_to_the_bound(empty_db_url: str) -> None:
    """No tables yet: every write fails; the ledger keeps the newest `max_pending` rows and writes them once the
    schema exists."""
    store = Store.open(empty_db_url)
    ledger = UsageLedger(store, max_pending=3, retry_s=0.05)
    ledger.start()
    try:
        for i in range(5):
            ledger.record(None, "/v1/generate", i, 0, 0, 200)
        assert not ledger.flush(timeout=0.3)  # cannot be written yet
        upgrade(empty_db_url)
        assert ledger.flush(timeout=60)
        (t,) = ledger.totals(None)
        assert (t.requests, t.prompt_tokens) == (3, 2 + 3 + 4)  # the newest three rows are the ones kept
    finally:
        ledger.close()
        store.close()


def test_without_a_writer_thread_flush_writes_in_the_caller(db_url: str) -> None:
    store = Store.open(db_url)
    try:
        ledger = UsageLedger(store)
        ledger.record(None, "/v1/generate", 3, 1, 2, 200)
        assert ledger.flush()
        (t,) = ledger.totals(None)
        assert (t.requests, t.prompt_tokens, t.cached_tokens, t.generated_tokens) == (1, 3, 1, 2)
    finally:
        store.close()


def test_a_row_the_store_refuses_does_not_block_the_others(db_url: str) -> None:
    store = Store.open(db_url)
    ledger = UsageLedger(store)
    try:
        key, _ = create_key(store, "a")
        ledger.record(key.id, "/v1/generate", 1, 0, 1, 200)
        ledger.record("key_that_never_existed", "/v1/generate", 5, 0, 5, 200)  # the foreign key refuses it
        ledger.record(key.id, "/v1/generate", 2, 0, 2, 200)
        ledger.start()
        assert ledger.flush()
        (t,) = ledger.totals(all_keys=True)
        assert (t.key_id, t.requests, t.prompt_tokens) == (key.id, 2, 3)
    finally:
        ledger.close()
        store.close()
