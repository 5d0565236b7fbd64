"""LISTEN/NOTIFY on Postgres: work another replica queued wakes an idle one at once, not at its next poll."""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Iterator

import pytest
from sqlalchemy import func, select

from sluicegate.config import Config, JobsConfig, WebhookConfig
from sluicegate.jobs import states as S
from sluicegate.jobs.store import JobStore
from sluicegate.store.db import Store
from sluicegate.store.models import BatchItem
from sluicegate.store.notify import JOBS, Listener, announce
from sluicegate.testing.wait import wait_for
from sluicegate.webhooks import Webhooks
from tests.api.threaded_server import threaded_server
from tests.dbs import postgres_database, url_string
from tests.jobs.test_job_store import make_job


@pytest.fixture
def pg() -> Iterator[Store]:
    with postgres_database() as url:  # skips when Postgres is absent
        from sluicegate.store.migrate import upgrade

        upgrade(url_string(url))
        store = Store.open(url)
        try:
            yield store
        finally:
            store.close()


def test_a_notification_arrives_at_commit_and_never_for_a_rollback(pg: Store) -> None:
    async def main() -> list[str]:
        got: asyncio.Queue[str] = asyncio.Queue()
        listener = Listener(pg.url, {JOBS: got.put_nowait})
        listener.start()
        try:
            await asyncio.wait_for(listener.listening.wait(), 30)

            def send() -> None:
                with pg.session() as s:
                    s.begin()
                    announce(s, JOBS, "rolled back")
                    s.rollback()
                with pg.session() as s, s.begin():
                    announce(s, JOBS, "committed")

            await asyncio.to_thread(send)
            return [await asyncio.wait_for(got.get(), 30)]
        finally:
            await listener.close()

    assert asyncio.run(main()) == ["committed"]  # the rolled-back one, sent first, never arrived


def test_an_idle_replica_runs_a_job_another_replica_queued_without_waiting_for_its_poll(pg: Store) -> None:
    # the worker's poll is ten minutes: only the notification can start the job within the test's wait
    config = Config(jobs=JobsConfig(poll_s=600.0, lease_s=60.0))
    with threaded_server(config, store=pg) as srv:
        worker = wait_for(lambda: srv.state.batch.worker, 60, message="the batch worker")
        wait_for(lambda: worker.looks >= 1 and srv.state.listener is not None and srv.state.listener.listening.is_set(),
                 60, message="the worker's first look and the listener")
        jobs = JobStore(Store.open(pg.url))  # another replica's own connection
        try:
            job = make_job(jobs, 3)

            def finished() -> bool:
                with pg.session() as s:
                    return s.scalar(select(func.count()).where(BatchItem.job_id == job, BatchItem.state.in_(
                        (S.DONE, S.ITEM_FAILED)))) == 3

            wait_for(finished, 60, message="the other replica's items to be run here")
        finally:
            jobs.store.close()


def test_a_retry_announced_by_another_replica_is_looked_for_when_due() -> None:
    async def main() -> tuple[bool, float, bool]:
        hooks = Webhooks(Store.open("sqlite://"), WebhookConfig())
        hooks._wake = asyncio.Event()
        hooks.notified(f"{time.time() + 30:.3f}")
        later = hooks._retry_due - time.monotonic()
        hooks._wake.clear()
        hooks.notified("")
        return hooks._wake.is_set(), later, math.isfinite(hooks._retry_due)

    woke, later, kept = asyncio.run(main())
    assert woke and 25 < later <= 30.1 and kept


def test_the_reconnect_backoff_starts_afresh_after_a_good_connection(pg: Store) -> None:
    """Three failed connects back off 0.5, 1, 2 s; a connection that listened and then dropped starts again at
    0.5 s, not where the last outage left off (it never reset)."""
    from tests.store_faults import refusing

    class Fast(Listener):
        async def _sleep(self, seconds: float) -> None:
            await asyncio.sleep(0.01)

    async def main() -> tuple[list[float], list[float]]:
        listener = Fast(pg.url, {JOBS: lambda _p: None})
        with refusing(pg.url.render_as_string(hide_password=False)):
            listener.start()
            await asyncio.to_thread(wait_for, lambda: len(listener.waits) >= 3, message="three failed connects")
        await asyncio.to_thread(wait_for, listener.listening.is_set, message="listening again")
        first = list(listener.waits)
        with refusing(pg.url.render_as_string(hide_password=False)):  # ends the listening connection too
            await asyncio.to_thread(wait_for, lambda: len(listener.waits) > len(first), message="the next wait")
        await listener.close()
        return first, listener.waits[len(first):]

    first, second = asyncio.run(main())
    assert first[:3] == [0.5, 1.0, 2.0]
    assert second[0] == 0.5, (first, second)
