"""Two server processes sharing one Postgres database and one Redis, as two replicas behind a load balancer.

The servers are `sluicegate.testing.refserver` (the app on the reference backend, a real uvicorn process each,
steps slowed a little so generations overlap): what is under test is the shared state, not the model.

- one key with a token rate limit, many concurrent clients on both replicas for a few seconds: the tokens the
  two accept together stay within 5% of `capacity + rate x elapsed`, and every 429 was earned (the tokens
  taken before it reach 95% of `capacity + rate x elapsed` at that moment, less one request, the clock
  starting when the bucket was first reached);
- a key revoked through the store is refused by both within a second (polled with a generous bound; the
  delays are printed);
- one Idempotency-Key sent to both at once runs the work once: the engines' counters (`/metrics` of each) say
  one generation, and both clients end with the same answer.

Skipped, with the reason, where Postgres or Redis is absent.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass

import httpx
import pytest
import redis

from sluicegate.api.routes.metrics import parse_metrics
from sluicegate.store.db import Store
from sluicegate.store.migrate import upgrade
from sluicegate.tenancy.keys import Scope, create_key, revoke_key
from sluicegate.testing.refserver import RefServer, running
from sluicegate.testing.wait import wait_for
from tests.api.auth_helpers import auth
from tests.dbs import postgres_database, url_string
from tests.ratelimit.conftest import REDIS_URL, redis_absent

CAPACITY = 1000  # tokens
TPM = 12_000  # 200 tokens a second
DURATION_S = 5.0
CLIENTS_PER_REPLICA = 8
LOAD = {"prompt": "Hello there", "max_new_tokens": 8, "temperature": 0}  # 12 prompt tokens + 8: 20 a request
REQUEST_TOKENS = 20


@dataclass
class Replicas:
    servers: list[RefServer]
    admin: Store  # the shared database, as the CLI or an operator reaches it


@pytest.fixture(scope="module")
def replicas(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Replicas]:
    why = redis_absent()
    if why:
        pytest.skip(why)
    tmp = tmp_path_factory.mktemp("replicas")
    with postgres_database() as url:  # skips when Postgres is absent
        upgrade(url)
        shared = ["--database-url", url_string(url), "--redis-url", REDIS_URL, "--step-delay-ms", "5",
                  "--eos-slope", "0", "--slots", "8"]
        admin = Store.open(url)
        try:
            with running(tmp, *shared) as a, running(tmp, *shared) as b:
                yield Replicas([a, b], admin)
        finally:
            admin.close()


def key(r: Replicas, *scopes: Scope, tpm: int | None = None, burst: int | None = None) -> tuple[str, str]:
    """A new key (id, secret), once both replicas enforce keys (each sees the first within its cache's TTL)."""
    record, secret = create_key(r.admin, "replicas", set(scopes), tpm=tpm, burst=burst)
    for s in r.servers:
        wait_for(lambda s=s: httpx.get(s.url + "/v1/models", timeout=30).status_code == 401)
        wait_for(lambda s=s: httpx.get(s.url + "/v1/models", headers=auth(secret), timeout=30).status_code == 200)
    return record.id, secret


def test_one_rate_limit_across_two_replicas(replicas: Replicas) -> None:
    key_id, secret = key(replicas, Scope.GENERATE, tpm=TPM, burst=CAPACITY)
    rate = TPM / 60
    accepted: list[tuple[float, float, int]] = []  # (sent at, answered at, tokens) of each answered request
    refused: list[tuple[float, float]] = []  # (sent at, refusal received at) of each 429
    lock = threading.Lock()
    go = threading.Event()
    stop = threading.Event()
    start = 0.0

    def client(url: str) -> None:
        with httpx.Client(base_url=url, headers=auth(secret), timeout=60) as c:
            go.wait()
            while not stop.is_set():
                sent = time.monotonic() - start
                r = c.post("/v1/generate", json=LOAD)
                if r.status_code == 200:
                    used = r.json()["usage"]
                    tokens = used["prompt_tokens"] + used["completion_tokens"]
                    with lock:
                        accepted.append((sent, time.monotonic() - start, tokens))
                elif r.status_code == 429:
                    with lock:
                        refused.append((sent, time.monotonic() - start))
                    stop.wait(int(r.headers["retry-after-ms"]) / 1e3)  # as a client should
                else:
                    raise AssertionError(f"{r.status_code}: {r.text}")

    threads = [threading.Thread(target=client, args=(s.url,)) for s in replicas.servers
               for _ in range(CLIENTS_PER_REPLICA)]
    for t in threads:
        t.start()
    start = time.monotonic()
    go.set()
    time.sleep(DURATION_S)  # the load runs this long (a duration, not an assertion)
    stop.set()
    stopped = time.monotonic() - start
    for t in threads:
        t.join(120)
    ended = time.monotonic() - start  # the last admitted request was admitted before this
    total = sum(n for _, _, n in accepted)
    upper = CAPACITY + rate * ended
    print(f"accepted {total} tokens in {len(accepted)} requests ({len(refused)} refused with 429) over "
          f"{stopped:.2f}-{ended:.2f}s; capacity + rate x elapsed <= {upper:.0f}")
    assert refused  # the limit was reached: the clients asked for more than it allows
    assert total <= 1.05 * upper  # never more than the limit allows, across both replicas
    # Never less: each refusal was earned. The bucket is full when the first request reaches it, which is no later
    # than the first answer came back (on a loaded machine, well after `go`). A 429 decided between its request's
    # sending and its answer's arrival means the bucket then held less than one request's cost, so the requests
    # sent before that answer took at least capacity + rate x (its sending - the first answer) - one request. A
    # bound on the limiter's arithmetic, not on how fast a loaded machine served.
    first = min(answered for _, answered, _ in accepted)
    for sent, received in refused:
        taken = sum(n for at, _, n in accepted if at < received)
        floor = CAPACITY + rate * max(0.0, sent - first) - REQUEST_TOKENS
        assert taken >= 0.95 * floor, f"a 429 sent at {sent:.2f}s with {taken} tokens taken of {floor:.0f}"
    with redis.Redis.from_url(REDIS_URL) as r:
        r.delete(f"sluicegate:rl:{key_id}")


def test_a_key_revoked_in_the_store_is_refused_by_both_within_a_second(replicas: Replicas) -> None:
    record, secret = create_key(replicas.admin, "to revoke", {Scope.GENERATE})
    for s in replicas.servers:  # both hold it as valid in their caches
        wait_for(lambda s=s: httpx.get(s.url + "/v1/models", headers=auth(secret), timeout=30).status_code == 200)
    revoke_key(replicas.admin, record.id)
    revoked = time.monotonic()
    delays = []
    for s in replicas.servers:
        wait_for(lambda s=s: httpx.get(s.url + "/v1/models", headers=auth(secret), timeout=30).status_code == 401)
        delays.append(time.monotonic() - revoked)
    print("revocation refused by the replicas after " + ", ".join(f"{d * 1e3:.0f} ms" for d in delays))


def finished_total(s: RefServer, secret: str) -> float:
    text = httpx.get(s.url + "/metrics", headers=auth(secret), timeout=30).text
    return sum(v for k, v in parse_metrics(text).items() if k.startswith("sluicegate_requests_finished_total"))


def send_to_both_at_once(replicas: Replicas, body: dict[str, object], headers: dict[str, str]) -> list[httpx.Response]:
    barrier = threading.Barrier(len(replicas.servers))
    firsts: dict[int, httpx.Response] = {}

    def send(i: int, url: str) -> None:
        with httpx.Client(base_url=url, timeout=60) as c:
            c.get("/healthz")  # connected before the barrier
            barrier.wait()
            firsts[i] = c.post("/v1/generate", json=body, headers=headers)

    threads = [threading.Thread(target=send, args=(i, s.url)) for i, s in enumerate(replicas.servers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    return [firsts[i] for i in range(len(replicas.servers))]


def test_one_idempotency_key_sent_to_both_runs_once(replicas: Replicas) -> None:
    _, secret = key(replicas, Scope.GENERATE, Scope.METRICS)
    body: dict[str, object] = {"prompt": "Hello", "max_new_tokens": 100, "temperature": 0}  # 100 steps of 5 ms
    for attempt in range(3):  # three keys, each sent to both replicas at once
        before = sum(finished_total(s, secret) for s in replicas.servers)
        headers = {**auth(secret), "Idempotency-Key": f"both-{attempt}"}
        firsts = send_to_both_at_once(replicas, body, headers)
        statuses = sorted(r.status_code for r in firsts)
        assert statuses in ([200, 200], [200, 409]), statuses
        finals = []
        for s, r in zip(replicas.servers, firsts, strict=True):
            while r.status_code == 409:  # the other replica runs it: retry as the SDKs do
                assert r.headers["retry-after"] == "1"
                time.sleep(0.05)
                r = httpx.post(s.url + "/v1/generate", json=body, headers=headers, timeout=60)
            finals.append(r)
        assert finals[0].status_code == 200 and finals[0].content == finals[1].content  # one answer
        replayed = [r.headers.get("idempotent-replayed") == "true" for r in finals]
        assert sorted(replayed) == [False, True]
        ran = sum(finished_total(s, secret) for s in replicas.servers) - before
        print(f"key both-{attempt}: first answers {statuses}, {ran:.0f} generation(s) on the two replicas")
        assert ran == 1
