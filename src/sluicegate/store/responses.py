"""Stored responses (`/v1/responses`): write one, read it back for its key, delete it.

Synchronous SQLAlchemy; callers on the event loop run these in a thread. Every read names the key: a response
made by another key is not found (the route answers 404, never 403, so ids do not leak).
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

from sqlalchemy import delete, select

from sluicegate.store.db import Store
from sluicegate.store.models import ResponseRecord


@dataclass(frozen=True, slots=True)
class Stored:
    body: str  # the response object as JSON
    items: str  # its input items as a JSON array


def save(store: Store, *, id: str, key_id: str, created_at: dt.datetime, model: str, body: str,
         items: str) -> None:
    with store.session() as s, s.begin():
        s.add(ResponseRecord(id=id, key_id=key_id, created_at=created_at, model=model, body=body, items=items))


def get(store: Store, key_id: str, id: str) -> Stored | None:
    with store.session() as s:
        row = s.execute(select(ResponseRecord.body, ResponseRecord.items).where(
            ResponseRecord.id == id, ResponseRecord.key_id == key_id)).first()
    return None if row is None else Stored(row.body, row.items)


def remove(store: Store, key_id: str, id: str) -> bool:
    """Delete the response; False when this key has none by that id."""
    with store.session() as s, s.begin():
        result = s.execute(delete(ResponseRecord).where(ResponseRecord.id == id, ResponseRecord.key_id == key_id))
    return bool(getattr(result, "rowcount", 0))
