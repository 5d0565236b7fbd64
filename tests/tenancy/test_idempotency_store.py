"""Idempotency keys in the store, on SQLite and Postgres: claim, replay, mismatch, release, leases taken over,
expiry and pruning on a fake clock, and many threads claiming one key at once (the unique constraint decides)."""

from __future__ import annotations

import datetime as dt
import threading
from collections.abc import Iterator

import pytest
from sqlalchemy import func, select

from sluicegate.store.db import Store
from sluicegate.store.models import IdempotencyRecord
from sluicegate.tenancy.idempotency import ClaimState, IdempotencyStore, StoredAnswer

ANSWER = StoredAnswer(200, {"content-type": "application/json"}, b'{"text": "hi"}')
TTL_S = 3600.0
LEASE_S = 60.0


class Clock:
    def __init__(self) -> None:
        self.now = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)

    def __call__(self) -> dt.datetime:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += dt.timedelta(seconds=seconds)


@pytest.fixture
def store(db_url: str) -> Iterator[Store]:
    s = Store.open(db_url)
    yield s
    s.close()


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def idem(store: Store, clock: Clock) -> Iterator[IdempotencyStore]:
    i = IdempotencyStore(store, ttl_s=TTL_S, lease_s=LEASE_S, clock=clock)
    yield i
    i.close()


def rows(store: Store) -> int:
    with store.session() as s:
        return int(s.execute(select(func.count()).select_from(IdempotencyRecord)).scalar_one())


def test_claim_then_in_use_then_replay(idem: IdempotencyStore) -> None:
    first = idem.claim("key_a", "k1", "/v1/generate", "fp1")
    assert first.outcome is ClaimState.CLAIMED and first.owner and idem.held == 1
    assert idem.claim("key_a", "k1", "/v1/generate", "fp1").outcome is ClaimState.IN_USE
    assert idem.claim("key_a", "k1", "/v1/generate", "fp2").outcome is ClaimState.MISMATCH  # even while running
    assert idem.complete("key_a", "k1", first.owner, ANSWER)
    assert idem.held == 0
    again = idem.claim("key_a", "k1", "/v1/generate", "fp1")
    assert again.outcome is ClaimState.REPLAY and again.answer == ANSWER
    assert idem.claim("key_a", "k1", "/v1/generate", "fp2").outcome is ClaimState.MISMATCH
    assert idem.claim("key_b", "k1", "/v1/generate", "fp2").outcome is ClaimState.CLAIMED  # another API key's scope
    assert idem.claim("", "k1", "/v1/generate", "fp1").outcome is ClaimState.CLAIMED  # the auth-off scope


def test_a_remembered_answer_is_replayed_here_before_it_is_written(idem: IdempotencyStore, store: Store,
                                                                  clock: Clock) -> None:
    claim = idem.claim("s", "k", "/v1/generate", "fp")
    idem.remember("s", "k", "fp", ANSWER)
    got = idem.claim("s", "k", "/v1/generate", "fp")
    assert got.outcome is ClaimState.REPLAY and got.answer == ANSWER  # this process: from memory
    assert idem.claim("s", "k", "/v1/generate", "other").outcome is ClaimState.MISMATCH
    elsewhere = IdempotencyStore(store, clock=clock)  # another replica on the same database: the claim is still running
    try:
        assert elsewhere.claim("s", "k", "/v1/generate", "fp").outcome is ClaimState.IN_USE
        assert idem.complete("s", "k", claim.owner, ANSWER)
        assert elsewhere.claim("s", "k", "/v1/generate", "fp").answer == ANSWER
    finally:
        elsewhere.close()
    assert idem.claim("s", "k", "/v1/generate", "fp").answer == ANSWER  # from the store now


def test_release_frees_the_key_and_only_the_holder_acts(idem: IdempotencyStore, store: Store) -> None:
    first = idem.claim("s", "k", "/v1/generate", "fp")
    assert not idem.release("s", "k", "someone-else") and not idem.complete("s", "k", "someone-else", ANSWER)
    assert idem.claim("s", "k", "/v1/generate", "fp").outcome is ClaimState.IN_USE
    assert idem.release("s", "k", first.owner) and rows(store) == 0
    second = idem.claim("s", "k", "/v1/generate", "fp-other")  # released: nothing remembered, any request runs
    assert second.outcome is ClaimState.CLAIMED
    assert not idem.release("s", "k", first.owner)  # the first holder can no longer touch it
    assert idem.complete("s", "k", second.owner, ANSWER)
    assert not idem.release("s", "k", second.owner)  # an answer, once stored, stays until it expires


def test_a_lapsed_lease_is_taken_over_by_the_same_request_only(idem: IdempotencyStore, clock: Clock) -> None:
    dead = idem.claim("s", "k", "/v1/generate", "fp")
    clock.advance(LEASE_S + 1)  # its process died: nobody renewed it
    assert idem.claim("s", "k", "/v1/generate", "other").outcome is ClaimState.MISMATCH
    taken = idem.claim("s", "k", "/v1/generate", "fp")
    assert taken.outcome is ClaimState.CLAIMED and taken.owner != dead.owner
    assert not idem.complete("s", "k", dead.owner, ANSWER)  # the old holder cannot overwrite the new work
    assert idem.claim("s", "k", "/v1/generate", "fp").outcome is ClaimState.IN_USE
    assert idem.complete("s", "k", taken.owner, ANSWER)


def test_renewing_keeps_a_long_claim(idem: IdempotencyStore, clock: Clock) -> None:
    claim = idem.claim("s", "k", "/v1/generate", "fp")
    for _ in range(5):  # five leases long, renewed every half lease
        clock.advance(LEASE_S / 2)
        assert idem.renew() == 1
        assert idem.claim("s", "k", "/v1/generate", "fp").outcome is ClaimState.IN_USE
    assert idem.complete("s", "k", claim.owner, ANSWER)
    assert idem.renew() == 0


def test_expired_keys_are_as_good_as_absent_and_pruned(idem: IdempotencyStore, store: Store, clock: Clock) -> None:
    done = idem.claim("s", "old", "/v1/generate", "fp")
    idem.complete("s", "old", done.owner, ANSWER)
    clock.advance(TTL_S + 1)
    fresh = idem.claim("s", "old", "/v1/generate", "another request")  # replaced in place
    assert fresh.outcome is ClaimState.CLAIMED
    idem.release("s", "old", fresh.owner)
    for i in range(25):
        c = idem.claim("s", f"k{i}", "/v1/generate", "fp")
        idem.complete("s", f"k{i}", c.owner, ANSWER)
    clock.advance(TTL_S / 2)
    kept = idem.claim("s", "young", "/v1/generate", "fp")
    idem.complete("s", "young", kept.owner, ANSWER)
    clock.advance(TTL_S / 2 + 1)
    assert idem.prune(batch=10) == 25  # three batches of about ten
    assert rows(store) == 1
    assert idem.claim("s", "young", "/v1/generate", "fp").outcome is ClaimState.REPLAY
    assert idem.prune() == 0


def _race(stores: list[Store], key: str) -> list[ClaimState]:
    barrier = threading.Barrier(len(stores))
    outcomes: list[ClaimState] = []

    def claim(s: Store) -> None:
        idem = IdempotencyStore(s)
        try:
            barrier.wait()
            outcomes.append(idem.claim("s", key, "/v1/generate", "fp").outcome)
        finally:
            idem.close()

    threads = [threading.Thread(target=claim, args=(s,)) for s in stores]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    return outcomes


def test_many_claims_at_once_one_wins(db_url: str) -> None:
    """Threads each with its own engine (as replicas are): exactly one claim lands, the rest see it running."""
    stores = [Store.open(db_url) for _ in range(8)]
    try:
        for round_ in range(5):
            outcomes = _race(stores, f"race-{round_}")
            assert sorted(o.value for o in outcomes) == ["claimed"] + ["in_use"] * (len(stores) - 1)
    finally:
        for s in stores:
            s.close()


def test_without_on_conflict_the_constraint_still_decides(idem: IdempotencyStore) -> None:
    """A database without INSERT ... ON CONFLICT: the plain insert's IntegrityError says the key exists."""
    idem._insert = None
    first = idem.claim("s", "k", "/v1/generate", "fp")
    assert first.outcome is ClaimState.CLAIMED
    assert idem.claim("s", "k", "/v1/generate", "fp").outcome is ClaimState.IN_USE
    assert idem.claim("s", "k", "/v1/generate", "other").outcome is ClaimState.MISMATCH
    assert idem.complete("s", "k", first.owner, ANSWER)
    assert idem.claim("s", "k", "/v1/generate", "fp").answer == ANSWER


def test_a_claim_at_once_never_waits_for_the_sqlite_write_lock(store: Store, idem: IdempotencyStore,
                                                                clock: Clock) -> None:
    """On a SQLite file the claim runs on the caller's thread when the write lock is free, and gives way
    (None, nothing written) when another writer holds it; on Postgres it always gives way to a thread."""
    if not store.is_sqlite:
        assert idem.claim_at_once("key_a", "k1", "/v1/generate", "fp1") is None
        assert idem.complete_at_once("key_a", "k1", "owner", ANSWER) is None
        return
    with store.engine.connect() as other:
        other.exec_driver_sql("BEGIN IMMEDIATE")  # another writer holds the file's write lock
        assert idem.claim_at_once("key_a", "k1", "/v1/generate", "fp1") is None
        other.rollback()
    assert rows(store) == 0
    first = idem.claim_at_once("key_a", "k1", "/v1/generate", "fp1")
    assert first is not None and first.outcome is ClaimState.CLAIMED and idem.held == 1
    with store.session() as s:  # written by the driver's connection as the store's engine writes it
        rec = s.get(IdempotencyRecord, ("key_a", "k1"))
        assert rec is not None and (rec.owner, rec.fingerprint, rec.route) == (first.owner, "fp1", "/v1/generate")
        assert (rec.created_at, rec.locked_until, rec.expires_at) == (
            clock.now, clock.now + dt.timedelta(seconds=LEASE_S), clock.now + dt.timedelta(seconds=TTL_S))
    again = idem.claim_at_once("key_a", "k1", "/v1/generate", "fp1")
    assert again is not None and again.outcome is ClaimState.IN_USE
    with store.engine.connect() as other:  # the answer gives way too, changing nothing
        other.exec_driver_sql("BEGIN IMMEDIATE")
        assert idem.complete_at_once("key_a", "k1", first.owner, ANSWER) is None
        other.rollback()
    assert idem.held == 1
    assert idem.complete_at_once("key_a", "k1", first.owner, ANSWER) is True and idem.held == 0
    assert idem.complete_at_once("key_a", "k1", first.owner, ANSWER) is False  # no longer a running claim
    replayed = idem.claim_at_once("key_a", "k1", "/v1/generate", "fp1")
    assert replayed is not None and replayed.outcome is ClaimState.REPLAY and replayed.answer == ANSWER


def test_claims_made_on_the_event_loop_follow_the_same_rules(store: Store, idem: IdempotencyStore,
                                                              clock: Clock) -> None:
    """`claim_here` (SQLite: on the loop when the lock is free; Postgres: asynchronous connections) and the
    thread's `claim` see one another's claims: in use, replayed, mismatched, expired and claimed anew."""
    import asyncio

    async def scenario() -> None:
        try:
            first = await idem.claim_here("key_a", "k1", "/v1/generate", "fp1")
            assert first is not None and first.outcome is ClaimState.CLAIMED and idem.held == 1
            assert idem.claim("key_a", "k1", "/v1/generate", "fp1").outcome is ClaimState.IN_USE
            other = await idem.claim_here("key_a", "k1", "/v1/generate", "fp2")
            assert other is not None and other.outcome is ClaimState.MISMATCH
            assert idem.complete("key_a", "k1", first.owner, ANSWER)
            again = await idem.claim_here("key_a", "k1", "/v1/generate", "fp1")
            assert again is not None and again.outcome is ClaimState.REPLAY and again.answer == ANSWER
            clock.advance(TTL_S + 1)  # expired: the key is free again, claimed in place
            anew = await idem.claim_here("key_a", "k1", "/v1/generate", "fp2")
            assert anew is not None and anew.outcome is ClaimState.CLAIMED and rows(store) == 1
            threaded = await asyncio.to_thread(idem.claim, "key_a", "k2", "/v1/generate", "fp1")
            seen = await idem.claim_here("key_a", "k2", "/v1/generate", "fp1")
            assert threaded.outcome is ClaimState.CLAIMED and seen is not None and seen.outcome is ClaimState.IN_USE
            # the answer stored from the loop: only by the claim's holder, and the thread's claim replays it
            assert await idem.complete_here("key_a", "k2", "not-the-owner", ANSWER) is False
            assert await idem.complete_here("key_a", "k2", threaded.owner, ANSWER) is True
            replayed = idem.claim("key_a", "k2", "/v1/generate", "fp1")
            assert replayed.outcome is ClaimState.REPLAY and replayed.answer == ANSWER
        finally:
            await idem.aclose()

    asyncio.run(scenario())
