"""Revoking or expiring a key reaches its queued work: its batch job stops before its next item (the one running
may finish), ends `cancelled` with the reason, charges nothing more, and no webhook of the key's endpoints is
delivered after the revocation."""

from __future__ import annotations

import datetime as dt
import json

import httpx
from sqlalchemy import select

from sluicegate.config import Config, JobsConfig, WebhookConfig
from sluicegate.jobs import states as S
from sluicegate.jobs.output import item_request_id
from sluicegate.jobs.store import JobStore
from sluicegate.store.models import UsageRecord, WebhookDelivery
from sluicegate.tenancy.keys import Scope, revoke_key
from sluicegate.testing.wait import wait_for
from tests.api.auth_helpers import Served, auth, served
from tests.api.threaded_server import SlowRunner
from tests.webhooks.receiver import Receiver, receiver

ITEMS = 8
CONFIG = Config(jobs=JobsConfig(poll_s=0.05, worker_slots=1),
                webhooks=WebhookConfig(allow_networks=("127.0.0.0/8",), backoff_base_s=0.01, poll_s=0.05))


def _slow() -> SlowRunner:
    return SlowRunner(delay_s=0.03, n_ctx=2048, n_slots=4)  # an item of 8 tokens takes a quarter of a second or more


def _start(s: Served, hook_url: str) -> tuple[str, str, str]:
    key, secret = s.key(Scope.BATCH, Scope.GENERATE)
    with httpx.Client(base_url=s.url, headers=auth(secret), timeout=30) as c:
        hook = c.post("/v1/webhook-endpoints", json={"url": hook_url, "event_types": ["batch.cancelled",
                                                                                      "batch.completed"]})
        assert hook.status_code == 201, hook.text
        job = c.post("/v1/batch-predictions", json=[{"input": {"prompt": f"item {i}"},
                                                     "options": {"max_new_tokens": 8}} for i in range(ITEMS)])
        assert job.status_code == 202, job.text
        job_id = job.json()["id"]
        wait_for(lambda: c.get(f"/v1/batch-predictions/{job_id}").json()["progress"]["done"] >= 1,
                 message="the first item to finish")
    return key.id, secret, job_id


def _stopped(s: Served, key_id: str, job_id: str, since: dt.datetime, why: str) -> None:
    jobs = JobStore(s.admin)
    view = wait_for(lambda: (v := jobs.view(job_id, key_id)) is not None and v.job.status in S.FINAL and v,
                    message="the job to end")
    assert view.job.status == S.CANCELLED
    assert json.loads(view.job.errors)["data"][0]["code"] == f"key_{why}"
    done = [i for i in jobs.iter_items(job_id) if i.state == S.DONE]
    late = [i for i in done if i.finished_at is not None and i.finished_at > since]
    assert len(late) <= 1, "only the item running at the revocation may finish"
    assert len(done) < ITEMS and view.counts.get(S.ITEM_CANCELLED, 0) == ITEMS - len(done)
    s.srv.state.tenancy.ledger.flush()
    with s.admin.session() as db:
        charged = db.scalars(select(UsageRecord.request_id).where(UsageRecord.key_id == key_id)).all()
        deliveries = db.execute(select(WebhookDelivery.event_type, WebhookDelivery.status)
                                .where(WebhookDelivery.key_id == key_id)).all()
    # every charge is a finished item's: none for the items the revocation cancelled
    assert sorted(charged) == sorted(item_request_id(i.id) for i in done)
    assert [kind for kind, _status in deliveries] in ([], ["batch.cancelled"])
    assert all(status != "delivered" for _kind, status in deliveries)


def _never_delivered(s: Served, key_id: str, rx: Receiver) -> None:
    """The job's batch.cancelled event was queued, and is failed unsent: the receiver got nothing."""
    def failed() -> bool:
        with s.admin.session() as db:
            return db.scalar(select(WebhookDelivery.status).where(WebhookDelivery.key_id == key_id)) == "failed"

    wait_for(failed, message="the cancelled event's delivery to be failed unsent")
    assert rx.count() == 0


def test_a_revoked_keys_batch_stops_and_its_webhooks_are_not_sent(db_url: str) -> None:
    with receiver(204) as rx, served(db_url, CONFIG, _slow) as s:
        key_id, secret, job_id = _start(s, rx.url + "/hook")
        revoked = revoke_key(s.admin, key_id)
        assert revoked is not None and revoked.revoked_at is not None
        _stopped(s, key_id, job_id, revoked.revoked_at, "revoked")
        _never_delivered(s, key_id, rx)
        wait_for(lambda: httpx.get(f"{s.url}/v1/batch-predictions/{job_id}", headers=auth(secret),
                                   timeout=30).status_code == 401, message="the key refused (within the cache's TTL)")


def test_an_expired_keys_batch_stops(db_url: str) -> None:
    with receiver(204) as rx, served(db_url, CONFIG, _slow) as s:
        key_id, _secret, job_id = _start(s, rx.url + "/hook")
        s.expire(key_id)  # expired a second ago, seen by the store from now
        _stopped(s, key_id, job_id, dt.datetime.now(dt.UTC), "expired")
        _never_delivered(s, key_id, rx)
