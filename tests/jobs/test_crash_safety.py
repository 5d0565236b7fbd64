"""Crash safety over real processes: kill -9 mid-job and restart; SIGTERM hands leases back; two replicas on one
Postgres share a job and take over a killed one's items. Every item's result is written exactly once
(`result_writes` counts the writes; the output file has each custom_id once)."""

from __future__ import annotations

from pathlib import Path

import httpx

from sluicegate.store.db import Store
from sluicegate.store.migrate import upgrade
from sluicegate.testing.refserver import running
from sluicegate.testing.wait import wait_for
from tests.dbs import postgres_database, url_string
from tests.jobs.crash import SLOW, done_count, items, kill9, output_ids, submit

N = 300  # items in a job; each generates SHORT tokens, so 300 of them still finish in seconds
SHORT = 4


def _finished(url: str, batch_id: str) -> bool:
    return httpx.get(f"{url}/v1/batches/{batch_id}", timeout=30).json()["status"] == "completed"


def _exactly_once(admin: Store, url: str, batch_id: str) -> list[str | None]:
    rows = items(admin, batch_id)
    assert len(rows) == N and all(r.state == "done" and r.result_writes == 1 for r in rows)
    ids = output_ids(url, batch_id)
    assert sorted(ids) == sorted(f"r{i}" for i in range(N))
    return [r.finished_by for r in rows]


def test_kill_9_mid_job_then_restart_completes_every_item_once(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'store.db'}"
    upgrade(url)
    admin = Store.open(url)
    try:
        with running(tmp_path, "--database-url", url, *SLOW) as first:
            batch = submit(first.url, N, SHORT)
            wait_for(lambda: done_count(admin, batch) >= 5, message="some items done before the kill")
            kill9(first)
        at_kill = items(admin, batch)
        leased = [r for r in at_kill if r.state == "leased"]
        assert leased and done_count(admin, batch) < N  # killed mid-job, holding leases
        with running(tmp_path, "--database-url", url, *SLOW) as second:
            wait_for(lambda: _finished(second.url, batch), message="the job to complete after the restart")
            writers = _exactly_once(admin, second.url, batch)
        assert len(set(writers)) == 2  # the dead process's worker, then the restarted one
        taken_over = {r.custom_id for r in leased}
        assert all(r.attempts >= 2 for r in items(admin, batch) if r.custom_id in taken_over)
    finally:
        admin.close()


def test_sigterm_hands_leases_back(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'store.db'}"
    upgrade(url)
    admin = Store.open(url)
    try:
        with running(tmp_path, "--database-url", url, *SLOW) as server:
            batch = submit(server.url, N)
            wait_for(lambda: any(r.state == "leased" for r in items(admin, batch)), message="leases to be taken")
            server.proc.terminate()
            assert server.proc.wait(timeout=60) == 0  # the drain hands the leases back, then exits 0
        rows = items(admin, batch)
        assert not any(r.state == "leased" or r.owner for r in rows)  # nothing waits for a lease to expire
        assert any(r.state == "pending" for r in rows)
    finally:
        admin.close()


def test_two_replicas_share_a_job_and_one_is_killed(tmp_path: Path) -> None:
    with postgres_database() as pg:  # skips when Postgres is absent
        upgrade(pg)
        url = url_string(pg)
        admin = Store.open(url)
        try:
            with running(tmp_path, "--database-url", url, *SLOW) as a, \
                    running(tmp_path, "--database-url", url, *SLOW) as b:
                batch = submit(a.url, N, SHORT)

                def both_working() -> bool:
                    return len({r.finished_by for r in items(admin, batch) if r.state == "done"}) == 2

                wait_for(both_working, message="both replicas to finish items of the one job")
                kill9(b)
                wait_for(lambda: _finished(a.url, batch), message="the surviving replica to complete the job")
                writers = _exactly_once(admin, a.url, batch)
            assert len(set(writers)) == 2
        finally:
            admin.close()
