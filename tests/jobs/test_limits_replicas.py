"""Per-key limits that hold under concurrent creates across two replicas sharing the real Postgres (two
reference-server processes, real sockets): 30 creates released at once, half to each replica, and exactly as
many accepted as the limit allows, the rest 429 (jobs, enqueued tokens) or 422 (webhook endpoints), each
with its own code; the same on two replicas sharing one SQLite file. The jobs' items are slow (100 ms engine
steps, 100+ tokens each) so no job finishes, and frees its slot, while the creates race. The Postgres cases
are skipped, with the reason, where Postgres is absent."""

from __future__ import annotations

import io
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from sqlalchemy.engine import URL

from sluicegate.store.db import Store
from sluicegate.store.migrate import upgrade
from sluicegate.tenancy.keys import Scope, create_key
from sluicegate.testing.refserver import RefServer, running
from sluicegate.testing.wait import wait_for
from tests.api.auth_helpers import auth
from tests.dbs import BACKENDS, postgres_database, sqlite_url, url_string
from tests.jobs.helpers import chat_line, jsonl

MAX_JOBS = 3
MAX_TOKENS = 500  # estimated tokens of a key's unfinished jobs
MAX_ENDPOINTS = 16
BURST = 30


@dataclass
class Replicas:
    servers: list[RefServer]
    admin: Store


@contextmanager
def database(backend: str, tmp: Path) -> Iterator[URL | str]:
    if backend == "sqlite":
        yield sqlite_url(tmp)
        return
    with postgres_database() as url:  # skips when Postgres is absent
        yield url


@pytest.fixture(scope="module", params=BACKENDS)
def replicas(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Replicas]:
    tmp = tmp_path_factory.mktemp("limits")
    with database(request.param, tmp) as url:
        upgrade(url)
        shared = ["--database-url", url_string(url), "--step-delay-ms", "100", "--eos-slope", "0", "--ctx", "1024",
                  "--batch-max-concurrent-jobs", str(MAX_JOBS), "--batch-max-enqueued-tokens", str(MAX_TOKENS),
                  "--webhook-max-endpoints", str(MAX_ENDPOINTS), "--webhook-allow-network", "127.0.0.0/8"]
        admin = Store.open(url)
        try:
            with running(tmp, *shared) as a, running(tmp, *shared) as b:
                yield Replicas([a, b], admin)
        finally:
            admin.close()


def new_key(r: Replicas) -> str:
    """A new batch key's secret, once both replicas enforce keys and know it."""
    _, secret = create_key(r.admin, "limits", {Scope.BATCH, Scope.GENERATE})
    for s in r.servers:
        wait_for(lambda s=s: httpx.get(s.url + "/v1/files", timeout=30).status_code == 401)
        wait_for(lambda s=s: httpx.get(s.url + "/v1/files", headers=auth(secret), timeout=30).status_code == 200)
    return secret


def burst(r: Replicas, send: Callable[[httpx.Client, int], httpx.Response]) -> list[httpx.Response]:
    """BURST requests released together, alternating between the replicas."""
    gate = threading.Barrier(BURST)
    out: list[httpx.Response | None] = [None] * BURST

    def one(i: int) -> None:
        with httpx.Client(base_url=r.servers[i % 2].url, timeout=120) as c:
            gate.wait()
            out[i] = send(c, i)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(BURST)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(x is not None for x in out)
    return [x for x in out if x is not None]


def batch_file(r: Replicas, secret: str, max_tokens: int) -> str:
    data = jsonl([chat_line(0, max_tokens=max_tokens)])
    f = httpx.post(r.servers[0].url + "/v1/files", headers=auth(secret), timeout=60,
                   files={"file": ("in.jsonl", io.BytesIO(data))}, data={"purpose": "batch"})
    assert f.status_code == 200, f.text
    return str(f.json()["id"])


def create_batches(r: Replicas, secret: str, file_id: str) -> list[httpx.Response]:
    body = {"input_file_id": file_id, "endpoint": "/v1/chat/completions", "completion_window": "24h"}
    return burst(r, lambda c, _i: c.post("/v1/batches", json=body, headers=auth(secret)))


def test_concurrent_jobs_limit_holds_across_replicas(replicas: Replicas) -> None:
    secret = new_key(replicas)
    replies = create_batches(replicas, secret, batch_file(replicas, secret, max_tokens=100))  # ~130 tokens each
    accepted = [x for x in replies if x.status_code == 200]
    refused = [x for x in replies if x.status_code != 200]
    assert len(accepted) == MAX_JOBS, [x.text for x in replies]
    assert {x.status_code for x in refused} == {429}
    assert {x.json()["error"]["code"] for x in refused} == {"concurrent_jobs_limit"}
    assert all(f"the limit is {MAX_JOBS}" in x.json()["error"]["message"] for x in refused)
    listed = httpx.get(replicas.servers[1].url + "/v1/batches", headers=auth(secret), timeout=60).json()["data"]
    assert sorted(b["id"] for b in listed) == sorted(x.json()["id"] for x in accepted)  # refused ones left nothing


def test_enqueued_tokens_limit_holds_across_replicas(replicas: Replicas) -> None:
    secret = new_key(replicas)
    replies = create_batches(replicas, secret, batch_file(replicas, secret, max_tokens=200))  # ~230 tokens each
    accepted = [x for x in replies if x.status_code == 200]
    assert len(accepted) == MAX_TOKENS // 230, [x.text for x in replies]  # two fit in 500, a third does not
    assert {x.status_code for x in replies if x.status_code != 200} == {429}
    codes = {x.json()["error"]["code"] for x in replies if x.status_code != 200}
    assert "enqueued_tokens_limit" in codes and codes <= {"enqueued_tokens_limit", "concurrent_jobs_limit"}


def test_webhook_endpoints_limit_holds_across_replicas(replicas: Replicas) -> None:
    secret = new_key(replicas)
    replies = burst(replicas, lambda c, i: c.post("/v1/webhook-endpoints", headers=auth(secret), json={
        "url": f"http://127.0.0.1:9/hook/{i}", "event_types": ["batch.completed"]}))
    created = [x for x in replies if x.status_code == 201]
    refused = [x for x in replies if x.status_code != 201]
    assert len(created) == MAX_ENDPOINTS, [x.text for x in replies]
    assert {x.status_code for x in refused} == {422}
    assert {x.json()["error"]["code"] for x in refused} == {"too_many_endpoints"}
    listed = httpx.get(replicas.servers[0].url + "/v1/webhook-endpoints", headers=auth(secret), timeout=60)
    assert len(listed.json()["data"]) == MAX_ENDPOINTS
