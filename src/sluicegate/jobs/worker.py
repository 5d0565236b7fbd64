"""The batch worker: one per process, leasing items from the store and running them through the engine.

- Items run at `Priority.BATCH` (the scheduler takes every waiting interactive request first and ages batch
  requests only among themselves) and at most `slots` at once, fewer than the engine's slots, so interactive
  requests always find a free one: batch fills idle capacity and never starves them.
- Each item's tokens go to its key's usage ledger as it finishes (`on_usage`), not to the key's interactive
  rate-limit bucket (no admission is reserved for them).
- Leases are renewed every third of `lease_s`; a cancelled or expired job is seen at the next renewal (or at
  once, for a cancel made in this process) and its running items abort in the engine within a step.
- `stop()` (SIGTERM, shutdown) aborts what runs here and hands every lease back at once; after a crash the
  leases simply expire and any worker takes the items again. A result is written only under the writer's
  own lease (`JobStore.finish_item`), so each item's result is written exactly once.
- An item leased more than `MAX_ATTEMPTS` times (it took its process down each time) fails instead of
  running again.
- A job whose API key is revoked or expires stops (docs/jobs.md, "Revoked keys"): before each item the key is
  read from the store (not the key cache: a revocation is seen at once), and at every lease renewal and store
  sweep the running jobs' keys are checked. The job is cancelled with the reason in its `errors`
  (`key_revoked`, `key_expired`), its items not yet started never run, the ones running here abort (their
  partial tokens are not charged), and it ends `cancelled`. The item handler gets the key's record: its
  monthly budget covers batch items too (api/batch_items.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import functools
import logging
import secrets
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from sluicegate.engine.types import Priority
from sluicegate.errorcatalog import docs_url
from sluicegate.jobs import states as S
from sluicegate.jobs.leases import Lease
from sluicegate.jobs.store import JobStore
from sluicegate.serving.context import RequestContext, TokenUsage
from sluicegate.store.models import BatchJob
from sluicegate.store.polling import IdlePoll
from sluicegate.tenancy.keys import KeyRecord, get_key

log = logging.getLogger("sluicegate.jobs")
MAX_ATTEMPTS = 3
KEY_STOPPED = ("the API key that created this batch was {why}: its requests that had not finished were cancelled "
               "and are not charged")
RETRY_STATUS = 503  # an item's outcome meaning "not now": handed back, not failed (api/batch_items.py)


@dataclass(frozen=True, slots=True)
class ItemResult:
    """What one item's request came to: its HTTP status and body as the surface would have answered."""

    status_code: int
    body: Any
    usage: TokenUsage = field(default_factory=TokenUsage)

    @property
    def ok(self) -> bool:
        return self.status_code < 400


# (the body as JSON text, its context, the job's key as the store holds it now; None when auth is off)
Handler = Callable[[str, RequestContext, KeyRecord | None], Awaitable[ItemResult]]
Finalizer = Callable[[BatchJob], tuple[str | None, str | None]]  # the job's output and error file ids


@dataclass(slots=True)
class _Running:
    lease: Lease
    task: asyncio.Task[None]
    writing: bool = False


class Worker:
    def __init__(self, jobs: JobStore, handlers: Mapping[str, Handler], *, slots: int, lease_s: float,
                 poll_s: float, finalizer: Finalizer, on_usage: Callable[[str | None, str, ItemResult, str], None],
                 on_final: Callable[[BatchJob, str], None], validating_timeout_s: float = 600.0,
                 discard: Callable[[str], None] = lambda _file_id: None) -> None:
        """`on_final(job, final state)` announces a job's end; `discard(file id)` deletes an output file
        rendered for a job whose finalize claim was lost; both are called in a thread and may block."""
        self.jobs = jobs
        self.handlers = handlers
        self.slots = max(1, slots)
        self.lease_s = lease_s
        self.poll_s = poll_s
        self.finalizer = finalizer
        self.on_usage = on_usage
        self.on_final = on_final
        self.validating_timeout_s = validating_timeout_s
        self.discard = discard
        self._finalizing: asyncio.Task[int] | None = None
        self.owner = f"w_{secrets.token_hex(8)}"
        self._running: dict[int, _Running] = {}
        self._stopped_jobs: dict[str, str] = {}  # job id -> item state for its running items (cancel, expire)
        self._writes: set[asyncio.Task[bool]] = set()  # halted items' results being written (kept referenced)
        self._wake = asyncio.Event()
        self.looks = 0  # passes over the store so far (tests wait for the first)
        self._loop_task: asyncio.Task[None] | None = None
        self._stopping = False
        self._backoff_until = 0.0
        self.written = 0  # results written by this worker (metrics, tests)

    def start(self) -> None:
        self._loop_task = asyncio.create_task(self._loop(), name="sluicegate-jobs")

    def wake(self) -> None:
        self._wake.set()

    def cancel_job(self, job_id: str) -> None:
        """A cancel made in this process: the job's items running here abort now."""
        self._abort(job_id, S.ITEM_CANCELLED)
        self.wake()

    def _abort(self, job_id: str, state: str, *, but: int | None = None) -> None:
        """The job's items running here abort (`but` this one: its caller ends it itself)."""
        self._stopped_jobs[job_id] = state
        for r in list(self._running.values()):
            if r.lease.job_id == job_id and not r.writing and r.lease.id != but:  # a result being written stands
                r.task.cancel()

    async def _stop_revoked(self, job_ids: list[str] | None = None, *, but: int | None = None) -> None:
        """Cancel the unfinished jobs (of `job_ids`, else all) whose key was revoked or has expired."""
        for job_id, why in (await asyncio.to_thread(self.jobs.stopped_keys, job_ids)).items():
            await self._stop_for_key(job_id, why, but=but)

    async def _stop_for_key(self, job_id: str, why: str, *, but: int | None = None) -> None:
        code = f"key_{why}"
        if await asyncio.to_thread(self.jobs.cancel, job_id, (code, KEY_STOPPED.format(why=why))):
            log.warning("batch %s: its API key was %s; its remaining requests are cancelled", job_id, why)
        self._abort(job_id, S.ITEM_CANCELLED, but=but)

    async def stop(self) -> None:
        """Abort what runs here and hand every lease back."""
        self._stopping = True
        if self._loop_task is not None:
            self._loop_task.cancel()
        tasks: list[asyncio.Task[Any]] = [r.task for r in self._running.values()]
        if self._finalizing is not None:  # its claim goes stale and another process renders the files again
            tasks.append(self._finalizing)
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if self._loop_task is not None:
            await asyncio.gather(self._loop_task, return_exceptions=True)
        try:
            n = await asyncio.to_thread(self.jobs.leases.release, self.owner)
            if n:
                log.info("handed back %d batch item leases", n)
        except Exception:
            log.exception("handing back batch leases failed; they expire in %.0fs", self.lease_s)

    # -- the loop ----------------------------------------------------------------------------------------
    async def _loop(self) -> None:
        last_renew = last_sweep = 0.0
        poll = IdlePoll(self.poll_s)  # an idle worker backs off (store/polling.py)
        while not self._stopping:
            found = bool(self._running)
            try:
                now = time.monotonic()
                if now - last_renew >= self.lease_s / 3:
                    await self._renew()
                    last_renew = now
                if now - last_sweep >= max(self.poll_s, 1.0):
                    await asyncio.to_thread(self.jobs.expire_due)
                    await self._stop_revoked()
                    for job_id in await asyncio.to_thread(self.jobs.fail_stale_validating,
                                                          self.validating_timeout_s):
                        log.warning("batch %s: still validating after %gs; failed", job_id,
                                    self.validating_timeout_s)
                    last_sweep = now
                self._finalize_soon()
                free = self.slots - len(self._running)
                if free > 0 and now >= self._backoff_until:
                    for lease in await asyncio.to_thread(self.jobs.leases.lease, self.owner, free, self.lease_s):
                        self.run_item(lease)
                        found = True
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("batch worker: a store call failed; retrying")
            self._wake.clear()
            self.looks += 1
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), poll.after(found))

    async def _renew(self) -> None:
        ids = list(self._running)
        if not ids:
            return
        await asyncio.to_thread(self.jobs.leases.renew, self.owner, ids, self.lease_s)
        job_ids = list({r.lease.job_id for r in self._running.values()})
        for job_id, (state, *_rest) in (await asyncio.to_thread(self.jobs.jobs_states, job_ids)).items():
            if state == S.CANCELLING:
                self._abort(job_id, S.ITEM_CANCELLED)
        await self._stop_revoked(job_ids)

    def _finalize_soon(self) -> None:
        """Finalizing runs beside the loop, never in it: rendering a large job's files takes as long as it takes,
        and the loop meanwhile keeps renewing the leases of the items running here."""
        if self._finalizing is None or self._finalizing.done():
            self._finalizing = asyncio.create_task(self._finalize_ready(), name="sluicegate-jobs-finalize")

    async def _finalize_ready(self) -> int:
        """Finish the jobs whose items have all ended; returns how many were ready."""
        try:
            ready = await asyncio.to_thread(self.jobs.ready_to_finalize, self.lease_s)
            for job_id in ready:
                job = await asyncio.to_thread(self.jobs.claim_finalize, job_id, self.lease_s)
                if job is not None:
                    await self._finalize(job)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("batch worker: finalizing failed; retrying")
            return 0
        if ready:
            self.wake()  # look again at once: more may be ready
        return len(ready)

    async def _finalize(self, job: BatchJob) -> None:
        """One claimed job: its files rendered while a heartbeat keeps the claim fresh (every third of `lease_s`,
        so no other process takes it as stale), then completed only if the claim is still this one's."""
        assert job.finalizing_at is not None
        claim: dt.datetime = job.finalizing_at
        done = asyncio.Event()
        lost = False

        async def heartbeat() -> None:
            nonlocal claim, lost
            while not done.is_set():
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(done.wait(), self.lease_s / 3)
                    return
                fresh = await asyncio.to_thread(self.jobs.renew_finalize, job.id, claim)
                if fresh is None:
                    lost = True
                    return
                claim = fresh

        beat = asyncio.create_task(heartbeat())
        try:
            out, err = (None, None) if job.shape != "openai" else await asyncio.to_thread(self.finalizer, job)
        finally:
            done.set()
            await asyncio.gather(beat, return_exceptions=True)  # a renewal under way lands before `claim` is read
        final = await asyncio.to_thread(self.jobs.final_state, job)
        # announced before the state is final: a crash between the two re-announces on the next try, and
        # the event's stable id makes that a no-op where it was already queued
        await asyncio.to_thread(self.on_final, job, final)
        if lost or not await asyncio.to_thread(self.jobs.complete, job, final, out, err, claim):
            log.warning("batch %s: the finalize claim was taken over; this process's files are deleted", job.id)
            for fid in (out, err):
                if fid is not None:
                    await asyncio.to_thread(self.discard, fid)
            return
        self._stopped_jobs.pop(job.id, None)
        log.info("batch %s %s", job.id, final)

    # -- one item ----------------------------------------------------------------------------------------
    def run_item(self, lease: Lease) -> None:
        """Start running a leased item (the loop calls it for each lease it takes)."""
        task = asyncio.create_task(self._item(lease))
        task.add_done_callback(functools.partial(self._item_done, lease))
        self._running[lease.id] = _Running(lease, task)

    async def _item(self, lease: Lease) -> None:
        try:
            await self._run_item(lease)
        except asyncio.CancelledError:
            # a cancel or expiry seen here may land at any await of the item (reading the job's state, the
            # engine call): the item ends in the job's stopped state wherever it was, never left leased
            halted = self._stopped_jobs.get(lease.job_id)
            if self._stopping:
                return  # stop() hands the lease back
            if halted is None:
                raise
            await self._write(lease, halted, None, None)
        except Exception:
            log.exception("batch item %d: writing its result failed; its lease will expire", lease.id)

    def _item_done(self, lease: Lease, task: asyncio.Task[None]) -> None:
        """An item's task ended, however: its slot frees up. A task cancelled before it first ran never ran
        its body (nor its handlers): its item still gets the stopped job's state here, or it would stay leased,
        renewed by nobody's item, and its job would never finish."""
        self._running.pop(lease.id, None)
        halted = self._stopped_jobs.get(lease.job_id)
        if task.cancelled() and not self._stopping and halted is not None:
            write = asyncio.create_task(self._write(lease, halted, None, None))
            self._writes.add(write)
            write.add_done_callback(self._writes.discard)
        self.wake()

    async def _run_item(self, lease: Lease) -> None:
        states = await asyncio.to_thread(self.jobs.jobs_states, [lease.job_id])
        job_state, endpoint, key_id, _expires = states[lease.job_id]
        if job_state != S.IN_PROGRESS:
            stopped = S.ITEM_CANCELLED if job_state == S.CANCELLING else S.ITEM_EXPIRED
            await self._write(lease, stopped, None, None)
            return
        handler = self.handlers.get(endpoint)
        if lease.attempts > MAX_ATTEMPTS or handler is None or lease.body is None:
            why = "unsupported endpoint" if handler is None else "the item failed its worker too many times"
            body = {"error": {"type": "internal_error", "code": "item_failed", "message": why, "param": None,
                              "request_id": f"req_batch_{lease.id:x}",
                              "docs_url": docs_url("internal_error", "item_failed")}}
            await self._write(lease, S.ITEM_FAILED, 500, body)
            return
        key = None if key_id is None else await asyncio.to_thread(get_key, self.jobs.store, key_id)
        if key_id is not None and (key is None or not key.usable()):  # read now: the key cache may lag
            await self._stop_for_key(lease.job_id, "revoked" if key is None else key.state(), but=lease.id)
            await self._write(lease, S.ITEM_CANCELLED, None, None)
            return
        ctx = RequestContext(request_id=f"req_batch_{lease.id:x}", priority=Priority.BATCH, tenant=key_id or "",
                             key_id=key_id)
        outcome = await handler(lease.body, ctx, key)
        if outcome.status_code == RETRY_STATUS:  # the engine is full or stopping: run it later
            self._backoff_until = time.monotonic() + self.poll_s * 4
            await asyncio.shield(asyncio.to_thread(self.jobs.leases.release_item, self.owner, lease.id))
            return
        state = S.DONE if outcome.ok else S.ITEM_FAILED
        if await self._write(lease, state, outcome.status_code, outcome.body, outcome):
            self.on_usage(key_id, endpoint, outcome, ctx.request_id)

    async def _write(self, lease: Lease, state: str, status: int | None, body: Any,
                     outcome: ItemResult | None = None) -> bool:
        u = outcome.usage if outcome is not None else TokenUsage()
        if (running := self._running.get(lease.id)) is not None:
            running.writing = True
        written = await asyncio.shield(asyncio.to_thread(self.jobs.leases.finish_item, self.owner, lease.id, state,
                                                         status, body, u.prompt_tokens, u.generated_tokens))
        if written:
            self.written += 1
        else:
            log.warning("batch item %d: the lease was taken over; its result is not written here", lease.id)
        return bool(written)
