"""Finalizing off the lease-renewal path, once per job whatever replicas race: two workers (two replicas' worth)
on one store (a SQLite file, then the real Postgres), a short lease, and a finalizer that renders the real
output files only once the test lets it.

- While one job's files render (held up as a large job's would be), an item of another job running in the
  same worker keeps its lease: renewed, never taken over by the other worker, run once.
- A rendering that outlasts the lease keeps its claim: the other worker never finalizes the job again, and
  no output file is left that the job does not point to.

Waits are on the store's state (a lease or a claim renewed so many times), never on wall-clock bounds.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import threading
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import pytest
from sqlalchemy import func, select

from sluicegate.jobs.files import FileStore
from sluicegate.jobs.output import render_files
from sluicegate.jobs.store import JobStore
from sluicegate.jobs.worker import ItemResult, Worker
from sluicegate.serving.context import RequestContext
from sluicegate.store.db import Store
from sluicegate.store.models import BatchFile, BatchItem, BatchJob

LEASE_S = 3.0  # renewed every second: a loaded machine stalls a renewal for 2 s before a lease expires
WAIT_S = 60.0


@pytest.fixture
def store(db_url: str) -> Iterator[Store]:
    s = Store.open(db_url)
    try:
        yield s
    finally:
        s.close()


def make_job(jobs: JobStore, bodies: list[str]) -> str:
    job = jobs.create(key_id=None, shape="openai", endpoint="/v1/completions", window_s=3600, window="24h",
                      input_file_id=None, meta=None)
    jobs.add_items(job, [{"line": i + 1, "custom_id": f"c{i}", "body": b} for i, b in enumerate(bodies)])
    jobs.start(job, len(bodies), 0)
    return job


class Gate:
    """A finalizer that renders the real files, the first call held until `open` is set; counts its calls."""

    def __init__(self, jobs: JobStore, files: FileStore) -> None:
        self.jobs, self.files = jobs, files
        self.entered = threading.Event()
        self.open = threading.Event()
        self.calls: list[str] = []

    def __call__(self, job: BatchJob) -> tuple[str | None, str | None]:
        self.calls.append(job.id)
        if len(self.calls) == 1:
            self.entered.set()
            assert self.open.wait(WAIT_S)
        return render_files(self.jobs, self.files, job, 3600)


def worker(store: Store, gate: Gate, handler: Callable[[str, RequestContext], Awaitable[ItemResult]]) -> Worker:
    files = FileStore(store)
    return Worker(JobStore(store), {"/v1/completions": handler}, slots=2, lease_s=LEASE_S, poll_s=0.05,
                  finalizer=gate, on_usage=lambda *_a: None, on_final=lambda *_a: None, discard=files.delete)


async def until(check: Callable[[], Any], what: str) -> Any:
    """Poll the store (in a thread) until `check` holds; a generous bound, never a timing assertion."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + WAIT_S
    while not (got := await asyncio.to_thread(check)):
        assert loop.time() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.02)
    return got


def changes(read: Callable[[], dt.datetime | None], n: int) -> Callable[[], bool]:
    """A check that holds once `read()` has taken `n` new values since the first call."""
    seen: list[dt.datetime | None] = [read()]

    def check() -> bool:
        value = read()
        if value != seen[-1]:
            seen.append(value)
        return len(seen) > n

    return check


def test_an_items_lease_is_renewed_while_another_job_finalizes(store: Store) -> None:
    jobs = JobStore(store)
    gate = Gate(jobs, FileStore(store))
    fast = make_job(jobs, ['"fast"'])
    release = asyncio.Event()

    async def handler(body: str, ctx: RequestContext, _key: object) -> ItemResult:
        if body == '"slow"':
            await release.wait()
        return ItemResult(200, {"ok": body})

    def slow_item() -> BatchItem:
        with store.session() as s:
            return s.execute(select(BatchItem).where(BatchItem.job_id == slow)).scalar_one()

    async def scenario() -> None:
        nonlocal slow
        a = worker(store, gate, handler)
        a.start()
        await until(gate.entered.is_set, "the fast job to start finalizing")
        slow = make_job(jobs, ['"slow"'])
        a.wake()
        await until(lambda: slow_item().owner == a.owner, "the slow item to run in the same worker")
        b = worker(store, gate, handler)  # another replica, ready to take over any lease that expires
        b.start()
        await until(changes(lambda: slow_item().lease_until, 3), "the slow item's lease to be renewed 3 times")
        release.set()
        gate.open.set()
        await until(lambda: jobs.view(slow, None) and jobs.view(slow, None).job.status == "completed",  # type: ignore[union-attr]
                    "the slow job to complete")
        await a.stop()
        await b.stop()

    slow = ""
    asyncio.run(scenario())
    item = slow_item()
    assert item.attempts == 1 and item.result_writes == 1  # ran once, in the worker that first leased it
    assert jobs.view(fast, None).job.status == "completed"  # type: ignore[union-attr]


def test_a_job_is_finalized_once_while_replicas_race(store: Store) -> None:
    jobs = JobStore(store)
    gate = Gate(jobs, FileStore(store))
    job = make_job(jobs, ['"a"', '"b"'])

    async def handler(body: str, ctx: RequestContext, _key: object) -> ItemResult:
        return ItemResult(200, {"ok": body})

    def claim() -> dt.datetime | None:
        with store.session() as s:
            return s.execute(select(BatchJob.finalizing_at).where(BatchJob.id == job)).scalar_one()

    async def scenario() -> None:
        a, b = worker(store, gate, handler), worker(store, gate, handler)
        a.start()
        b.start()
        await until(gate.entered.is_set, "one worker to start finalizing")
        await until(changes(claim, 3), "the finalize claim to be renewed 3 times (past the lease)")
        looks = b.looks + a.looks
        await until(lambda: a.looks + b.looks >= looks + 6, "both workers to look again")
        gate.open.set()
        await until(lambda: jobs.view(job, None).job.status == "completed", "the job to complete")  # type: ignore[union-attr]
        await a.stop()
        await b.stop()

    asyncio.run(scenario())
    assert gate.calls == [job]  # rendered once: no other worker took the claim as stale
    done = jobs.view(job, None).job  # type: ignore[union-attr]
    with store.session() as s:
        outputs = s.execute(select(BatchFile.id).where(BatchFile.purpose == "batch_output")).scalars().all()
        assert s.execute(select(func.count()).select_from(BatchFile)).scalar() == len(outputs)
    assert outputs == [done.output_file_id]  # no orphan: the one file is the job's
