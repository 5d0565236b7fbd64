"""Jobs and items in the store: creation, reading, cancellation, expiry, finalizing (leases: jobs/leases.py).

A job's items are written `held` while it validates and become `pending` in the transaction that starts it,
so no worker can take an item of a job that may still fail validation.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import delete, exists, func, insert, select, update

from sluicegate.jobs import states as S
from sluicegate.jobs.files import new_id
from sluicegate.jobs.leases import Leases
from sluicegate.store.db import Store, UnknownCursor
from sluicegate.store.keylock import lock_key
from sluicegate.store.models import ApiKey, BatchItem, BatchJob
from sluicegate.store.notify import JOBS, announce


@dataclass(frozen=True, slots=True)
class JobView:
    """A job and its items' counts by state."""

    job: BatchJob
    counts: dict[str, int]

    @property
    def done(self) -> int:
        return self.counts.get(S.DONE, 0)

    @property
    def failed(self) -> int:
        return self.counts.get(S.ITEM_FAILED, 0)

    @property
    def finished(self) -> int:
        return sum(n for s, n in self.counts.items() if s not in S.OPEN_ITEMS)


class OverLimit(Exception):
    """A per-key limit would be passed; `before` is the key's count (jobs, or estimated tokens) without this
    job."""

    def __init__(self, before: int) -> None:
        super().__init__(before)
        self.before = before


def _owner_is(key_id: str | None) -> Any:
    return BatchJob.key_id.is_(None) if key_id is None else BatchJob.key_id == key_id


class JobStore:
    def __init__(self, store: Store) -> None:
        self.store = store
        self.leases = Leases(store)

    # -- creation ----------------------------------------------------------------------------------------
    def create(self, *, key_id: str | None, shape: str, endpoint: str, window_s: float, window: str,
               input_file_id: str | None, meta: dict[str, Any] | None, max_active: int | None = None) -> str:
        """A new job, `validating`; with `max_active`, OverLimit unless the key then has at most that many
        unfinished jobs: inserted, counted and kept or rolled back under the key's lock (store/keylock.py),
        so concurrent creates on any replica never pass the limit together."""
        job_id = new_id("batch_")
        now = self.store.now()
        with self.store.session() as s, s.begin():
            lock_key(s, "batch_jobs", key_id)
            s.execute(insert(BatchJob).values(
                id=job_id, key_id=key_id, shape=shape, endpoint=endpoint, status=S.VALIDATING,
                completion_window=window, input_file_id=input_file_id, meta=None if meta is None else json.dumps(meta),
                total=0, est_tokens=0, created_at=now, expires_at=now + dt.timedelta(seconds=window_s)))
            if max_active is not None:
                n = s.execute(select(func.count()).where(_owner_is(key_id), BatchJob.status.in_(S.ACTIVE))).scalar()
                if int(n or 0) > max_active:
                    raise OverLimit(int(n or 0) - 1)  # rolls the insert back
        return job_id

    def add_items(self, job_id: str, rows: Sequence[dict[str, Any]]) -> None:
        """Insert items: each {line, custom_id, body} (held until `start`), or with `state` failed and its
        `result`."""
        if not rows:
            return
        full = [{"job_id": job_id, "custom_id": None, "body": None, "state": S.HELD, "status_code": None,
                 "result": None, "attempts": 0, "result_writes": 0, "finished_by": None, "prompt_tokens": 0,
                 "completion_tokens": 0, "finished_at": None, **r} for r in rows]
        with self.store.session() as s, s.begin():
            s.execute(insert(BatchItem), full)

    def start(self, job_id: str, total: int, est_tokens: int, *, key_id: str | None = None,
              max_tokens: int | None = None) -> None:
        """Validated: the job turns in_progress and its items leasable, in one transaction. A job cancelled while
        it was validating keeps its status, and its items are cancelled instead. With `max_tokens`, OverLimit
        (nothing changed) unless the key's unfinished jobs then estimate at most that many tokens, checked under
        the key's lock as `create` checks the job count."""
        now = self.store.now()
        with self.store.session() as s, s.begin():
            lock_key(s, "batch_jobs", key_id)
            res = s.execute(update(BatchJob).where(BatchJob.id == job_id, BatchJob.status == S.VALIDATING).values(
                status=S.IN_PROGRESS, in_progress_at=now, total=total, est_tokens=est_tokens))
            started = bool(res.rowcount)  # type: ignore[attr-defined]
            if started and max_tokens is not None:
                q = select(func.coalesce(func.sum(BatchJob.est_tokens), 0)).where(
                    _owner_is(key_id), BatchJob.status.in_(S.ACTIVE))
                enqueued = int(s.execute(q).scalar() or 0)
                if enqueued > max_tokens:
                    raise OverLimit(enqueued - est_tokens)  # rolls the start back: the caller discards the job
            if not started:
                s.execute(update(BatchJob).where(BatchJob.id == job_id).values(total=total, est_tokens=est_tokens))
            s.execute(update(BatchItem).where(BatchItem.job_id == job_id, BatchItem.state == S.HELD).values(
                state=S.PENDING) if started else
                update(BatchItem).where(BatchItem.job_id == job_id, BatchItem.state == S.HELD).values(
                state=S.ITEM_CANCELLED, finished_at=now))
            if started:
                announce(s, JOBS)  # every replica's worker, at commit (store/notify.py)

    def fail(self, job_id: str, errors: list[dict[str, Any]]) -> None:
        """Validation failed: the job fails whole, with OpenAI's `errors` list; no item runs."""
        with self.store.session() as s, s.begin():
            s.execute(delete(BatchItem).where(BatchItem.job_id == job_id))
            s.execute(update(BatchJob).where(BatchJob.id == job_id).values(
                status=S.FAILED, failed_at=self.store.now(), errors=json.dumps({"object": "list", "data": errors})))

    def discard(self, job_id: str) -> None:
        """A job refused while it was being read (a per-key limit): as if it had never been."""
        with self.store.session() as s, s.begin():
            s.execute(delete(BatchItem).where(BatchItem.job_id == job_id))
            s.execute(delete(BatchJob).where(BatchJob.id == job_id))

    # -- reading -----------------------------------------------------------------------------------------
    def view(self, job_id: str, key_id: str | None, *, shape: str | None = None) -> JobView | None:
        with self.store.session() as s:
            job = s.get(BatchJob, job_id)
            if job is None or job.key_id != key_id or (shape is not None and job.shape != shape):
                return None
            return JobView(job, self._counts(s, job_id))

    @staticmethod
    def _counts(s: Any, job_id: str) -> dict[str, int]:
        rows = s.execute(select(BatchItem.state, func.count()).where(BatchItem.job_id == job_id)
                         .group_by(BatchItem.state)).all()
        return {str(st): int(n) for st, n in rows}

    def list_jobs(self, key_id: str | None, shape: str, *, limit: int, after: str | None) -> list[JobView]:
        j = BatchJob
        q = select(j).where(_owner_is(key_id), j.shape == shape)
        with self.store.session() as s:
            anchor = None if after is None else s.get(j, after)
            if after is not None and (anchor is None or anchor.key_id != key_id or anchor.shape != shape):
                raise UnknownCursor(after)
            if anchor is not None:
                q = q.where((j.created_at < anchor.created_at) | ((j.created_at == anchor.created_at) & (j.id < after)))
            jobs = s.execute(q.order_by(j.created_at.desc(), j.id.desc()).limit(limit)).scalars().all()
            return [JobView(job, self._counts(s, job.id)) for job in jobs]

    def items(self, job_id: str, *, after_line: int, limit: int) -> list[BatchItem]:
        q = (select(BatchItem).where(BatchItem.job_id == job_id, BatchItem.line > after_line)
             .order_by(BatchItem.line).limit(limit))
        with self.store.session() as s:
            return list(s.execute(q).scalars().all())

    def iter_items(self, job_id: str, page: int = 500) -> Iterator[BatchItem]:
        after = 0
        while rows := self.items(job_id, after_line=after, limit=page):
            yield from rows
            after = rows[-1].line

    def jobs_states(self, job_ids: Sequence[str]) -> dict[str, tuple[str, str, str | None, dt.datetime]]:
        """{job id: (state, endpoint, key id, expires_at)} for the given jobs."""
        j = BatchJob
        with self.store.session() as s:
            rows = s.execute(select(j.id, j.status, j.endpoint, j.key_id, j.expires_at).where(j.id.in_(job_ids)))
            return {r[0]: (r[1], r[2], r[3], r[4]) for r in rows}

    # -- cancel, expire, finalize -------------------------------------------------------------------------
    def cancel(self, job_id: str, reason: tuple[str, str] | None = None) -> bool:
        """Cancelling: pending items never start; leased ones end as their workers see it. False: the job
        was already finished (or failed validation). `reason`: (code, message) kept as the job's `errors` when
        the server cancels it (its key was revoked or expired), not its owner."""
        now = self.store.now()
        errors = None if reason is None else json.dumps({"object": "list", "data": [
            {"code": reason[0], "message": reason[1], "line": None, "param": None}]})
        with self.store.session() as s, s.begin():
            res = s.execute(update(BatchJob).where(BatchJob.id == job_id, BatchJob.status.in_(
                (S.VALIDATING, S.IN_PROGRESS))).values(status=S.CANCELLING, cancelling_at=now,
                                                       **({} if errors is None else {"errors": errors})))
            if not res.rowcount:  # type: ignore[attr-defined]
                return False
            s.execute(update(BatchItem).where(BatchItem.job_id == job_id, BatchItem.state.in_((S.HELD, S.PENDING)))
                      .values(state=S.ITEM_CANCELLED, finished_at=now))
        return True

    def stopped_keys(self, job_ids: Sequence[str] | None = None) -> dict[str, str]:
        """{job id: `revoked` or `expired`} for unfinished jobs (of `job_ids`, else all) whose API key can no
        longer be used: their work stops (docs/jobs.md, "Revoked keys")."""
        j, k = BatchJob, ApiKey
        q = (select(j.id, k.revoked_at).join(k, k.id == j.key_id)
             .where(j.status.in_((S.VALIDATING, S.IN_PROGRESS, S.CANCELLING)), k.unusable(self.store.now())))
        if job_ids is not None:
            q = q.where(j.id.in_(job_ids))
        with self.store.session() as s:
            return {r[0]: "revoked" if r[1] is not None else "expired" for r in s.execute(q.limit(1000))}

    def expire_due(self) -> None:
        """Jobs past their window: their pending items expire (leased ones finish), then they finalize."""
        now = self.store.now()
        with self.store.session() as s, s.begin():
            ids = s.execute(select(BatchJob.id).where(BatchJob.status == S.IN_PROGRESS,
                                                      BatchJob.expires_at <= now)).scalars().all()
            if ids:
                s.execute(update(BatchItem).where(BatchItem.job_id.in_(ids), BatchItem.state == S.PENDING)
                          .values(state=S.ITEM_EXPIRED, finished_at=now))

    def fail_stale_validating(self, timeout_s: float) -> list[str]:
        """Jobs `validating` for longer than `timeout_s` (the process reading their input died, or it hangs):
        failed with `validation_timeout`, their held items deleted, so they hold no slot of the key's limits."""
        j = BatchJob
        cutoff = self.store.now() - dt.timedelta(seconds=timeout_s)
        errors = json.dumps({"object": "list", "data": [{
            "code": "validation_timeout", "line": None, "param": None,
            "message": f"The input was not validated within {timeout_s:g} seconds; create the batch again."}]})
        with self.store.session() as s, s.begin():
            ids = list(s.execute(select(j.id).where(j.status == S.VALIDATING, j.created_at < cutoff)
                                 .limit(100)).scalars().all())
            if ids:
                s.execute(update(j).where(j.id.in_(ids), j.status == S.VALIDATING).values(
                    status=S.FAILED, failed_at=self.store.now(), errors=errors))
                s.execute(delete(BatchItem).where(BatchItem.job_id.in_(ids), BatchItem.state == S.HELD))
        return ids

    def ready_to_finalize(self, stale_s: float) -> list[str]:
        """Jobs with no open item left, and jobs a dead process left half-finalized."""
        j, i = BatchJob, BatchItem
        stale = self.store.now() - dt.timedelta(seconds=stale_s)
        no_open = ~exists().where(i.job_id == j.id, i.state.in_(S.OPEN_ITEMS))
        q = select(j.id).where(((j.status.in_((S.IN_PROGRESS, S.CANCELLING))) & no_open)
                               | ((j.status == S.FINALIZING) & (j.finalizing_at < stale)))
        with self.store.session() as s:
            return list(s.execute(q.limit(100)).scalars().all())

    def claim_finalize(self, job_id: str, stale_s: float) -> BatchJob | None:
        """Move the job to finalizing (or re-claim a stale one); None if another process has it."""
        j, i = BatchJob, BatchItem
        now = self.store.now()
        no_open = ~exists().where(i.job_id == j.id, i.state.in_(S.OPEN_ITEMS))
        cond = (((j.status.in_((S.IN_PROGRESS, S.CANCELLING))) & no_open)
                | ((j.status == S.FINALIZING) & (j.finalizing_at < now - dt.timedelta(seconds=stale_s))))
        with self.store.session() as s, s.begin():
            res = s.execute(update(j).where(j.id == job_id, cond).values(status=S.FINALIZING, finalizing_at=now))
            if not res.rowcount:  # type: ignore[attr-defined]
                return None
            return s.get(j, job_id)

    def final_state(self, job: BatchJob) -> str:
        """Where a finalizing job ends, from how it got here: cancelled, expired, or completed."""
        if job.cancelling_at is not None:
            return S.CANCELLED
        with self.store.session() as s:
            expired = self._counts(s, job.id).get(S.ITEM_EXPIRED, 0)
        return S.EXPIRED if expired else S.COMPLETED

    def renew_finalize(self, job_id: str, claim: dt.datetime) -> dt.datetime | None:
        """Keep a finalize claim fresh while the output is rendered (so no other process takes it as stale):
        the claim's new stamp, or None when it is no longer the caller's."""
        fresh = max(self.store.now(), claim + dt.timedelta(microseconds=1))
        j = BatchJob
        with self.store.session() as s, s.begin():
            res = s.execute(update(j).where(j.id == job_id, j.status == S.FINALIZING, j.finalizing_at == claim)
                            .values(finalizing_at=fresh))
        return fresh if res.rowcount else None  # type: ignore[attr-defined]

    def complete(self, job: BatchJob, final: str, output_file_id: str | None, error_file_id: str | None,
                 claim: dt.datetime | None = None) -> bool:
        """The job's final state and files, written only while the finalize claim (`claim`: its stamp,
        `job.finalizing_at` if not given) is the caller's: a job is completed exactly once. False: it was not
        (the caller's files are then nobody's, and the caller deletes them)."""
        stamp = {S.CANCELLED: "cancelled_at", S.EXPIRED: "expired_at", S.COMPLETED: "completed_at"}[final]
        claim = claim or job.finalizing_at
        j = BatchJob
        with self.store.session() as s, s.begin():
            res = s.execute(update(j).where(j.id == job.id, j.status == S.FINALIZING, j.finalizing_at == claim)
                            .values(status=final, output_file_id=output_file_id, error_file_id=error_file_id,
                                    **{stamp: self.store.now()}))
        return bool(res.rowcount)  # type: ignore[attr-defined]
