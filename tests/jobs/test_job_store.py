"""The job store on SQLite and Postgres: leases never overlap, a result is written once and only under the
writer's own lease, leases hand back and expire, cancel and finalize move the state machine."""

from __future__ import annotations

import datetime as dt
import threading
import time
from collections.abc import Iterator

import pytest
from sqlalchemy import update

from sluicegate.jobs import states as S
from sluicegate.jobs.files import FileStore, Writer
from sluicegate.jobs.output import render_files
from sluicegate.jobs.store import JobStore
from sluicegate.store.db import Store
from sluicegate.store.models import BatchJob


@pytest.fixture
def store(db_url: str) -> Iterator[Store]:
    s = Store.open(db_url)
    try:
        yield s
    finally:
        s.close()


def make_job(jobs: JobStore, n: int) -> str:
    job = jobs.create(key_id=None, shape="openai", endpoint="/v1/completions", window_s=3600, window="24h",
                      input_file_id=None, meta=None)
    jobs.add_items(job, [{"line": i + 1, "custom_id": f"c{i}", "body": "{}"} for i in range(n)])
    jobs.start(job, n, 0)
    return job


def test_concurrent_leases_never_share_an_item(store: Store) -> None:
    jobs = JobStore(store)
    make_job(jobs, 60)
    taken: dict[str, list[int]] = {}

    def grab(owner: str) -> None:
        got: list[int] = []
        while batch := jobs.leases.lease(owner, 3, 60):
            got += [x.id for x in batch]
        taken[owner] = got

    threads = [threading.Thread(target=grab, args=(f"w{i}",)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    every = [i for got in taken.values() for i in got]
    assert len(every) == 60 and len(set(every)) == 60


def test_a_result_is_written_once_and_only_under_the_writers_lease(store: Store) -> None:
    jobs = JobStore(store)
    job = make_job(jobs, 2)
    (a,) = jobs.leases.lease("old", 1, 0.01)
    time.sleep(0.05)  # the lease expires (a dead worker)
    (b,) = jobs.leases.lease("new", 1, 60)
    assert a.id == b.id and b.attempts == 2  # the expired lease is taken over first (oldest item)
    assert not jobs.leases.finish_item("old", a.id, S.DONE, 200, {"x": 1})  # the old owner writes nothing
    assert jobs.leases.finish_item("new", b.id, S.DONE, 200, {"x": 2})
    assert not jobs.leases.finish_item("new", b.id, S.DONE, 200, {"x": 3})  # and never twice
    (item, _other) = jobs.items(job, after_line=0, limit=10)
    assert item.result_writes == 1 and item.result == '{"x": 2}' and item.finished_by == "new"


def test_release_hands_leases_back_at_once(store: Store) -> None:
    jobs = JobStore(store)
    make_job(jobs, 3)
    assert len(jobs.leases.lease("leaving", 3, 600)) == 3
    assert jobs.leases.lease("other", 3, 600) == []
    assert jobs.leases.release("leaving") == 3
    again = jobs.leases.lease("other", 3, 600)
    assert len(again) == 3 and {x.attempts for x in again} == {1}  # a hand-back is not a failed attempt


def test_cancel_then_finalize(store: Store) -> None:
    jobs = JobStore(store)
    job = make_job(jobs, 3)
    (running,) = jobs.leases.lease("w", 1, 600)
    assert jobs.cancel(job)
    assert jobs.leases.lease("w2", 5, 600) == []  # pending items never start
    assert jobs.ready_to_finalize(60) == []  # one item still runs
    assert jobs.leases.finish_item("w", running.id, S.ITEM_CANCELLED, None, None)
    assert jobs.ready_to_finalize(60) == [job]
    claimed = jobs.claim_finalize(job, 60)
    assert claimed is not None and jobs.claim_finalize(job, 60) is None  # one finalizer
    files = FileStore(store)
    out, err = render_files(jobs, files, claimed, 3600)
    assert out is None and err is not None
    assert len(list(files.lines(err))) == 3
    assert jobs.final_state(claimed) == S.CANCELLED
    jobs.complete(claimed, S.CANCELLED, out, err)
    view = jobs.view(job, None)
    assert view is not None and view.job.status == S.CANCELLED and view.job.error_file_id == err
    assert not jobs.cancel(job)


def test_files_round_trip_in_chunks(store: Store) -> None:
    files = FileStore(store)
    fid = files.begin("k", "batch", "a.jsonl", None)
    w = Writer(files, fid)
    assert files.get(fid, "k") is None  # not whole yet: not visible
    payload = b"".join(b'{"n": %d}\n' % i for i in range(60_000))  # ~0.6 MB: several chunks
    for i in range(0, len(payload), 10_000):
        w.write(payload[i:i + 10_000])
    assert w.close() == len(payload)
    info = files.get(fid, "k")
    assert info is not None and info.bytes == len(payload) and files.get(fid, "other") is None
    assert b"".join(files.chunks(fid)) == payload
    assert sum(1 for _ in files.lines(fid)) == 60_000
    files.delete(fid)
    assert files.get(fid, "k") is None and files.chunk(fid, 0) is None


def test_a_job_past_its_window_expires(store: Store) -> None:
    jobs = JobStore(store)
    job = make_job(jobs, 3)
    (running,) = jobs.leases.lease("w", 1, 600)
    with store.session() as s, s.begin():
        s.execute(update(BatchJob).where(BatchJob.id == job).values(
            expires_at=dt.datetime.now(dt.UTC) - dt.timedelta(seconds=1)))
    jobs.expire_due()
    assert jobs.leases.lease("w2", 5, 600) == []  # its pending items expired
    assert jobs.leases.finish_item("w", running.id, S.DONE, 200, {})  # the running one still finishes
    claimed = jobs.claim_finalize(job, 60)
    assert claimed is not None and jobs.final_state(claimed) == S.EXPIRED
    out, err = render_files(jobs, FileStore(store), claimed, 3600)
    jobs.complete(claimed, S.EXPIRED, out, err)
    assert out is not None and err is not None
    lines = list(FileStore(store).lines(err))
    assert len(lines) == 2 and all(b"batch_expired" in x for x in lines)


def test_files_expire_and_are_pruned(store: Store) -> None:
    files = FileStore(store)
    old = files.begin("k", "batch", "old.jsonl", -1.0)  # already past its expiry
    Writer(files, old).close()
    kept = files.begin("k", "batch", "kept.jsonl", None)
    w = Writer(files, kept)
    w.write(b"{}\n")
    w.close()
    assert files.get(old, "k") is None and files.get(kept, "k") is not None
    assert [f.id for f in files.list_files("k", purpose="batch", limit=10, after=None, newest_first=True)] == [kept]
    assert files.prune() == 1
    assert files.chunk(old, 0) is None and files.get(kept, "k") is not None


def test_jobs_share_the_worker_line_by_line(store: Store) -> None:
    jobs = JobStore(store)
    big = make_job(jobs, 6)
    small = make_job(jobs, 2)
    got = jobs.leases.lease("w", 4, 600)
    assert sorted((x.job_id == small, x.line) for x in got) == [(False, 1), (False, 2), (True, 1), (True, 2)]
    assert {x.job_id for x in jobs.leases.lease("w", 10, 600)} == {big}


def test_items_cancelled_before_their_tasks_first_ran_still_end(store: Store) -> None:
    """A cancel that reaches the worker between leasing items and their tasks' first step (a task cancelled
    before it runs never runs its body): the items still end `cancelled`, the slots free up, the job finishes."""
    import asyncio

    from sluicegate.jobs.worker import ItemResult, Worker

    jobs = JobStore(store)
    job = make_job(jobs, 4)
    ran: list[str] = []

    async def handler(body: str, ctx: object, _key: object) -> ItemResult:
        ran.append(body)
        await asyncio.Event().wait()  # never answers: only a cancel ends it
        raise AssertionError("unreachable")

    async def scenario() -> None:
        worker = Worker(jobs, {"/v1/completions": handler}, slots=4, lease_s=60, poll_s=0.05,
                        finalizer=lambda j: (None, None), on_usage=lambda *a: None, on_final=lambda j, f: None)
        for lease in jobs.leases.lease(worker.owner, 2, 60):
            worker.run_item(lease)
        assert jobs.cancel(job)
        worker.cancel_job(job)  # before the loop yields: neither task has run a line yet
        while worker.written < 2:  # each halted item's result written (the store first, then the count)
            await asyncio.sleep(0.01)
        assert not ran and not any(i.state == S.LEASED for i in jobs.iter_items(job))

    asyncio.run(asyncio.wait_for(scenario(), 60))
    assert sorted(i.state for i in jobs.iter_items(job)) == [S.ITEM_CANCELLED] * 4
