"""Stored predictions: write one record, read it back for its key, list a key's records with a cursor.

Synchronous SQLAlchemy; callers on the event loop run these in a thread. Every read names the key: a
prediction made by another key is not found (the route answers 404, never 403, so ids do not leak).

Listing is newest first, OpenAI-style cursors: `after` is the id of the last record of the previous page; the
next page holds the records strictly older in (created_at, id) order, so a page is stable while new
predictions arrive.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

from sqlalchemy import and_, or_, select

from sluicegate.store.db import Store, UnknownCursor
from sluicegate.store.models import PredictionRecord


@dataclass(frozen=True, slots=True)
class Page:
    bodies: list[str]  # the records' JSON, newest first
    ids: list[str]
    has_more: bool


def save(store: Store, *, id: str, key_id: str, created_at: dt.datetime, model: str, body: str) -> None:
    with store.session() as s, s.begin():
        s.add(PredictionRecord(id=id, key_id=key_id, created_at=created_at, model=model, body=body))


def get(store: Store, key_id: str, id: str) -> str | None:
    with store.session() as s:
        return s.scalar(select(PredictionRecord.body).where(
            PredictionRecord.id == id, PredictionRecord.key_id == key_id))


def page(store: Store, key_id: str, *, limit: int, after: str | None = None) -> Page:
    """Up to `limit` records of `key_id`, newest first, older than the record `after` when given."""
    q = select(PredictionRecord.id, PredictionRecord.body).where(PredictionRecord.key_id == key_id)
    with store.session() as s:
        if after is not None:
            cursor = s.scalar(select(PredictionRecord.created_at).where(
                PredictionRecord.id == after, PredictionRecord.key_id == key_id))
            if cursor is None:
                raise UnknownCursor(after)
            q = q.where(or_(PredictionRecord.created_at < cursor,
                            and_(PredictionRecord.created_at == cursor, PredictionRecord.id < after)))
        rows = s.execute(q.order_by(PredictionRecord.created_at.desc(), PredictionRecord.id.desc())
                         .limit(limit + 1)).all()
    rows = rows[:limit + 1]
    return Page([r.body for r in rows[:limit]], [r.id for r in rows[:limit]], len(rows) > limit)
