"""Webhook endpoints and deliveries in the store (synchronous; callers on the event loop use a thread).

Every read and change of an endpoint names its API key: another key's endpoint is not found. Deliveries are
claimed for sending with a compare-and-set on `next_attempt_at` (pushed out by a lease), so replicas sharing a
database never send one attempt twice; a sender that dies leaves the row due again when the lease ends. The
attempt's outcome is written with the same compare-and-set (`record_attempt`: the row must still hold this
sender's lease), so a sender frozen past its lease and resumed writes nothing over the delivery another sender
took over: a delivered attempt is never turned back to pending, nor its log entry erased. Every time here is
the database's clock (`Store.now`), not each replica's.

A revoked or expired key's deliveries are never sent: the claim reads each due delivery's key with it, and
fails those of a key that can no longer be used (`last_error` says why) instead of claiming them, so nothing
is delivered after the revocation reached the store, whatever the key cache of any replica still holds.
"""

from __future__ import annotations

import base64
import datetime as dt
import json
import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, cast

from sqlalchemy import CursorResult, Result, func, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from sluicegate.store.db import Store
from sluicegate.store.keylock import lock_key
from sluicegate.store.models import ApiKey, WebhookDelivery, WebhookEndpoint
from sluicegate.store.notify import WEBHOOKS, announce

PENDING, DELIVERED, FAILED = "pending", "delivered", "failed"


def now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def new_secret() -> str:
    return "whsec_" + base64.b64encode(secrets.token_bytes(32)).decode()


def _changed(result: Result[Any]) -> int:
    return int(cast(CursorResult[Any], result).rowcount)


class TooManyEndpoints(Exception):
    """The key already has the most endpoints allowed."""


def create_endpoint(store: Store, key_id: str, url: str, event_types: list[str],
                    limit: int | None = None) -> WebhookEndpoint:
    """A new endpoint; with `limit`, TooManyEndpoints unless the key then has at most that many: inserted,
    counted and kept or rolled back under the key's lock (store/keylock.py), so concurrent creates on any
    replica never pass the limit together."""
    ep = WebhookEndpoint(id="we_" + secrets.token_hex(12), key_id=key_id, url=url,
                         event_types=" ".join(sorted(set(event_types))), secret=new_secret(), created_at=now())
    with store.session() as s, s.begin():
        lock_key(s, "webhook_endpoints", key_id)
        s.add(ep)
        s.flush()  # the insert first: on SQLite the write lock is then held to the commit
        if limit is not None and _count(s, key_id) > limit:
            raise TooManyEndpoints  # rolls the insert back
    return ep


def _count(s: Session, key_id: str) -> int:
    return int(s.scalar(select(func.count()).select_from(WebhookEndpoint).where(
        WebhookEndpoint.key_id == key_id, WebhookEndpoint.deleted_at.is_(None))) or 0)


def list_endpoints(store: Store, key_id: str) -> list[WebhookEndpoint]:
    with store.session() as s:
        return list(s.scalars(select(WebhookEndpoint).where(
            WebhookEndpoint.key_id == key_id, WebhookEndpoint.deleted_at.is_(None)
        ).order_by(WebhookEndpoint.created_at, WebhookEndpoint.id)))


def get_endpoint(store: Store, key_id: str, endpoint_id: str) -> WebhookEndpoint | None:
    with store.session() as s:
        return s.scalar(select(WebhookEndpoint).where(
            WebhookEndpoint.id == endpoint_id, WebhookEndpoint.key_id == key_id,
            WebhookEndpoint.deleted_at.is_(None)))


def delete_endpoint(store: Store, key_id: str, endpoint_id: str) -> bool:
    """Mark it deleted (its delivery log stays) and fail what it still had to send."""
    with store.session() as s, s.begin():
        done = _changed(s.execute(update(WebhookEndpoint).where(
            WebhookEndpoint.id == endpoint_id, WebhookEndpoint.key_id == key_id,
            WebhookEndpoint.deleted_at.is_(None)).values(deleted_at=now())))
        if done:
            _fail_pending(s, endpoint_id, "the endpoint was deleted")
    return bool(done)


def _fail_pending(s: Any, endpoint_id: str, why: str) -> None:
    s.execute(update(WebhookDelivery).where(
        WebhookDelivery.endpoint_id == endpoint_id, WebhookDelivery.status == PENDING
    ).values(status=FAILED, last_error=why))


def enqueue(store: Store, key_id: str, event_type: str, event_id: str, body: str, subject: str | None) -> int:
    """One pending delivery per enabled endpoint of `key_id` subscribed to `event_type`; an endpoint that
    already has this event (the same `event_id` emitted again) gets none. Returns how many were queued."""
    for _ in range(2):  # a second replica inserting the same event at once: read again, insert the rest
        with store.session() as s:
            eps = s.execute(select(WebhookEndpoint.id, WebhookEndpoint.event_types).where(
                WebhookEndpoint.key_id == key_id, WebhookEndpoint.deleted_at.is_(None),
                WebhookEndpoint.disabled_at.is_(None))).all()
            have = set(s.scalars(select(WebhookDelivery.endpoint_id).where(WebhookDelivery.event_id == event_id)))
        todo = sorted(ep for ep, types in eps if event_type in types.split() and ep not in have)
        if not todo:
            return 0
        t = store.now()
        try:
            with store.session() as s, s.begin():
                s.add_all(WebhookDelivery(
                    event_id=event_id, endpoint_id=ep, key_id=key_id, event_type=event_type, subject=subject,
                    body=body, status=PENDING, attempts=0, next_attempt_at=t, log="[]", created_at=t,
                ) for ep in todo)
                announce(s, WEBHOOKS)  # every replica's dispatcher, at commit (store/notify.py)
            return len(todo)
        except IntegrityError:
            continue
    return 0


@dataclass(frozen=True, slots=True)
class Claimed:
    id: int
    endpoint_id: str
    event_id: str
    body: str
    attempts: int
    url: str
    secret: str
    log: list[dict[str, Any]]
    lease_until: dt.datetime | None = None  # the row's `next_attempt_at` while this sender holds it


def claim_due(store: Store, limit: int, lease_s: float, *, per_endpoint: int = 1 << 30,
              busy: Mapping[str, int] | None = None) -> list[Claimed]:
    """Up to `limit` due deliveries, each leased to this caller until `lease_s` from now; at most
    `per_endpoint` to one endpoint, counting the `busy` ones (endpoint id -> attempts this caller has in
    flight). Endpoints already full are left out of the query, so one endpoint's backlog never hides another's."""
    busy = dict(busy or {})
    full = sorted(ep for ep, n in busy.items() if n >= per_endpoint)
    t = store.now()
    out: list[Claimed] = []
    stopped = ApiKey.unusable(t)
    q = (select(WebhookDelivery, WebhookEndpoint.url, WebhookEndpoint.secret, stopped)
         .join(WebhookEndpoint, WebhookEndpoint.id == WebhookDelivery.endpoint_id)
         .outerjoin(ApiKey, ApiKey.id == WebhookDelivery.key_id)  # none when auth is off
         .where(WebhookDelivery.status == PENDING, WebhookDelivery.next_attempt_at <= t))
    if full:
        q = q.where(WebhookDelivery.endpoint_id.not_in(full))
    with store.session() as s:
        rows = s.execute(q.order_by(WebhookDelivery.next_attempt_at).limit(limit)).all()
    dead = [d.id for d, _url, _secret, key_stopped in rows if key_stopped]
    if dead:  # never sent: the key was revoked or has expired (the module doc)
        with store.session() as s, s.begin():
            s.execute(update(WebhookDelivery).where(WebhookDelivery.id.in_(dead), WebhookDelivery.status == PENDING)
                      .values(status=FAILED, last_error="not sent: the API key was revoked or has expired"))
    for d, url, secret, key_stopped in rows:
        if key_stopped:
            continue
        if busy.get(d.endpoint_id, 0) >= per_endpoint:
            continue
        lease_until = t + dt.timedelta(seconds=lease_s)
        with store.session() as s, s.begin():
            got = _changed(s.execute(update(WebhookDelivery).where(
                WebhookDelivery.id == d.id, WebhookDelivery.status == PENDING,
                WebhookDelivery.next_attempt_at == d.next_attempt_at,
            ).values(next_attempt_at=lease_until)))
        if got:
            busy[d.endpoint_id] = busy.get(d.endpoint_id, 0) + 1
            out.append(Claimed(d.id, d.endpoint_id, d.event_id, d.body, d.attempts, url, secret, json.loads(d.log),
                               lease_until))
    return out


def record_attempt(store: Store, c: Claimed, *, status: str, status_code: int | None, error: str | None,
                   duration_ms: float, retry_at: dt.datetime | None, disable: str | None = None) -> bool:
    """One attempt's outcome: delivered, failed for good, or pending again until `retry_at`. `disable`: also
    disable the endpoint for this reason and fail what it still had queued (in the same transaction). Written
    only while the row still holds this sender's lease; False: it did not (nothing written)."""
    t = store.now()
    entry = {"at": t.isoformat(timespec="milliseconds").replace("+00:00", "Z"), "status_code": status_code,
             "error": error, "duration_ms": round(duration_ms, 1)}
    values: dict[str, Any] = {
        "status": status, "attempts": c.attempts + 1, "last_status_code": status_code, "last_error": error,
        "log": json.dumps([*c.log, entry]), "next_attempt_at": retry_at or t,
    }
    if status == DELIVERED:
        values["delivered_at"] = t
    with store.session() as s, s.begin():
        held = update(WebhookDelivery).where(WebhookDelivery.id == c.id, WebhookDelivery.status == PENDING)
        if c.lease_until is not None:
            held = held.where(WebhookDelivery.next_attempt_at == c.lease_until)
        if not _changed(s.execute(held.values(**values))):
            return False  # the lease ran out and another sender has the delivery: its word stands
        if retry_at is not None and status == PENDING:  # whichever replica is idle then sends it
            announce(s, WEBHOOKS, f"{retry_at.timestamp():.3f}")
        if disable is not None:
            s.execute(update(WebhookEndpoint).where(WebhookEndpoint.id == c.endpoint_id).values(
                disabled_at=t, disabled_reason=disable))
            _fail_pending(s, c.endpoint_id, "the endpoint was disabled")
    return True


def deliveries(store: Store, key_id: str, *, endpoint_id: str | None = None, subject: str | None = None,
               limit: int = 100) -> list[WebhookDelivery]:
    """A key's delivery log, newest first: one endpoint's, or every delivery about one subject (a job)."""
    q = select(WebhookDelivery).where(WebhookDelivery.key_id == key_id)
    if endpoint_id is not None:
        q = q.where(WebhookDelivery.endpoint_id == endpoint_id)
    if subject is not None:
        q = q.where(WebhookDelivery.subject == subject)
    with store.session() as s:
        return list(s.scalars(q.order_by(WebhookDelivery.created_at.desc(), WebhookDelivery.id.desc())
                              .limit(limit)))
