"""Leases and claims hold against a sender frozen past its lease and a replica whose clock runs ahead: a webhook
outcome is written only under the writer's own lease (compare-and-set, like batch items), and every lease is
read on the database's clock."""

from __future__ import annotations

import datetime as dt
import json
import time

from sqlalchemy import select

from sluicegate.jobs.store import JobStore
from sluicegate.store.db import Clock, Store
from sluicegate.store.models import WebhookDelivery
from sluicegate.tenancy.keys import create_key
from sluicegate.webhooks import store as db

EVENT = json.dumps({"id": "evt_1"})


def test_a_stale_sender_cannot_overwrite_a_delivery_another_finished(db_url: str) -> None:
    store = Store.open(db_url)
    try:
        key, _ = create_key(store, "hooks")
        db.create_endpoint(store, key.id, "https://hooks.example/x", ["batch.completed"])
        assert db.enqueue(store, key.id, "batch.completed", "evt_1", EVENT, "batch_1") == 1
        [frozen] = db.claim_due(store, 1, lease_s=-1)  # its lease ran out at once: as if frozen past it
        [fresh] = db.claim_due(store, 1, lease_s=60)  # another sender takes the delivery over
        assert fresh.id == frozen.id
        assert db.record_attempt(store, fresh, status=db.DELIVERED, status_code=204, error=None, duration_ms=3,
                                 retry_at=None)
        # the frozen sender resumes, its attempt failed: nothing of it lands
        assert not db.record_attempt(store, frozen, status=db.PENDING, status_code=None, error="timed out",
                                     duration_ms=25000, retry_at=store.now() + dt.timedelta(seconds=1))
        with store.session() as s:
            row = s.scalar(select(WebhookDelivery).where(WebhookDelivery.id == fresh.id))
        assert row is not None and row.status == db.DELIVERED and row.attempts == 1
        assert [e["status_code"] for e in json.loads(row.log)] == [204]
        assert db.claim_due(store, 1, lease_s=60) == []  # delivered: never sent again
    finally:
        store.close()


def test_a_replica_whose_clock_runs_ahead_takes_no_other_replicas_lease(postgres_store_url: str) -> None:
    from tests.dbs import truncate

    truncate(postgres_store_url)
    normal = Store.open(postgres_store_url)
    ahead = Store.open(postgres_store_url)
    ahead.clock = Clock(local=lambda: time.time() + 45)  # this machine's clock 45 s fast
    try:
        assert abs((ahead.now() - normal.now()).total_seconds()) < 2  # both read the database's clock
        jobs = JobStore(normal)
        job_id = jobs.create(key_id=None, shape="seed", endpoint="/v1/predictions", window_s=3600, window="1h",
                             input_file_id=None, meta=None)
        jobs.add_items(job_id, [{"line": i, "body": "{}"} for i in range(1, 9)])
        jobs.start(job_id, 8, 8)
        taken = jobs.leases.lease("w_normal", 8, lease_s=30)
        assert len(taken) == 8
        assert JobStore(ahead).leases.lease("w_ahead", 8, lease_s=30) == []  # 30 s leases are not over for it
    finally:
        normal.close()
        ahead.close()
