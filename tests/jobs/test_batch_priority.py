"""Batch items fill idle capacity: at most the worker's slots run at once, an interactive request is served
while a job runs, and batch tokens never touch the key's interactive rate-limit bucket."""

from __future__ import annotations

from pathlib import Path

import httpx

from sluicegate.config import Config, JobsConfig
from sluicegate.engine.types import Priority
from sluicegate.store.migrate import upgrade
from sluicegate.tenancy.keys import Scope, create_key
from sluicegate.testing.wait import wait_for
from tests.api.auth_helpers import auth, served
from tests.api.threaded_server import SlowRunner
from tests.dbs import sqlite_url
from tests.jobs.helpers import poll_seed


def test_batch_uses_its_slots_only_and_never_the_interactive_bucket(tmp_path: Path) -> None:
    url = sqlite_url(tmp_path)
    upgrade(url)
    config = Config(jobs=JobsConfig(poll_s=0.05, worker_slots=2))
    with served(url, config, runner=lambda: SlowRunner(n_ctx=2048, n_slots=4, delay_s=0.01)) as s:
        _rec, secret = create_key(s.admin, "app", {Scope.BATCH, Scope.GENERATE}, tpm=600, burst=300)
        c = httpx.Client(base_url=s.url, headers=auth(secret), timeout=60)
        items = [{"input": {"prompt": f"batch item {i}"}, "options": {"max_new_tokens": 40, "temperature": 0}}
                 for i in range(16)]  # ~16 x 45 tokens: more than twice the key's whole bucket
        job = c.post("/v1/batch-predictions", json=items).json()["id"]
        engine = s.srv.state.runtime.engine
        assert engine is not None

        def batch_running() -> int:
            return sum(q.request.priority == Priority.BATCH for q in list(engine.scheduler.running))

        wait_for(lambda: batch_running() >= 1, message="batch items in the engine")
        r = c.post("/v1/generate", json={"prompt": "hello", "max_new_tokens": 4, "temperature": 0})
        assert r.status_code == 200, r.text  # served while the job runs
        assert c.get(f"/v1/batch-predictions/{job}").json()["status"] in ("queued", "running")
        peak = 0
        while c.get(f"/v1/batch-predictions/{job}").json()["status"] in ("queued", "running"):
            peak = max(peak, batch_running())
        assert 1 <= peak <= 2  # never more than the worker's slots: the other two stay free for interactive work
        done = poll_seed(c, job)
        assert done["status"] == "succeeded"
        spent = sum(x["result"]["usage"]["input_tokens"] + x["result"]["usage"]["output_tokens"]
                    for x in c.get(f"/v1/batch-predictions/{job}/results").json()["data"])
        assert spent > 300  # the job used more than the bucket holds ...
        r = c.post("/v1/generate", json={"prompt": "hello", "max_new_tokens": 4, "temperature": 0})
        assert r.status_code == 200  # ... and the bucket still admits: batch tokens are not charged to it
        assert int(r.headers["x-ratelimit-remaining-tokens"]) >= 300 - 2 * 20
        c.close()
