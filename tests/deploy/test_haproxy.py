"""deploy/haproxy.cfg as shipped, in front of three reference replicas on one Postgres (sluicegate.testing.cluster):
TLS with a certificate made here, requests spread over the replicas, the drain honoured (a replica restarted
under traffic costs no request, and leaves the rotation before it exits), HAProxy's own errors in the envelope."""

from __future__ import annotations

import json
import threading
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from sluicegate.testing.cluster import Cluster, haproxy_binary
from sluicegate.testing.wait import wait_for
from tests.dbs import postgres_database, url_string

pytestmark = pytest.mark.skipif(haproxy_binary() is None, reason="haproxy is not installed (apt-get install haproxy)")
GEN = {"prompt": "Hello", "max_new_tokens": 4, "temperature": 0}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    with postgres_database() as url, Cluster(tmp_path_factory.mktemp("cluster"), url_string(url), None,
                                             args=["--drain-seconds", "20"]) as c:
        yield c


def replica_of(c: Cluster, request_id: str) -> int:
    for r in c.replicas:
        for line in r.log_path.read_text(errors="replace").splitlines():
            if line.startswith("{") and request_id in line and json.loads(line).get("request_id") == request_id:
                return r.index
    raise AssertionError(f"no replica logged {request_id}")


def test_tls_is_terminated_and_the_callers_request_id_reaches_the_replica(cluster: Cluster) -> None:
    with pytest.raises(httpx.ConnectError):  # a client that does not trust the certificate is refused
        httpx.get(f"{cluster.url}/healthz", timeout=10)
    r = httpx.post(f"{cluster.url}/v1/generate", json=GEN, verify=cluster.tls, timeout=30,
                   headers={"X-Request-Id": "trace-me-123"})
    assert r.status_code == 200 and r.headers["x-request-id"] == "trace-me-123" == r.json()["id"]
    assert "max-age" in r.headers["strict-transport-security"]
    plain = httpx.get(f"{cluster.http_url}/v1/models", timeout=10)
    assert plain.status_code == 308 and plain.headers["location"].startswith("https://")


def test_requests_are_spread_over_every_replica(cluster: Cluster) -> None:
    with httpx.Client(verify=cluster.tls, timeout=30) as client:
        ids = [client.post(f"{cluster.url}/v1/generate", json=GEN).headers["x-request-id"] for _ in range(12)]
    assert set(Counter(replica_of(cluster, i) for i in ids)) == {0, 1, 2}


def test_a_restart_under_traffic_costs_no_request_and_the_replica_leaves_the_rotation_first(cluster: Cluster) -> None:
    statuses: Counter[int] = Counter()
    stop = threading.Event()
    seen_down = threading.Event()

    def load() -> None:
        with httpx.Client(verify=cluster.tls, timeout=60) as client:  # no retries of its own
            while not stop.is_set():
                statuses[client.post(f"{cluster.url}/v1/generate", json=GEN).status_code] += 1

    def watch() -> None:
        while not stop.is_set() and not seen_down.is_set():
            if cluster.rotation().get("r1") not in (None, "UP"):
                seen_down.set()

    threads = [threading.Thread(target=load) for _ in range(3)] + [threading.Thread(target=watch)]
    for t in threads:
        t.start()
    try:
        status = cluster.stop(0)  # SIGTERM: the drain
        cluster.start(0)
        cluster.wait_in_rotation([0])
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=120)
    assert status == 0 and seen_down.is_set()
    assert set(statuses) == {200} and statuses[200] > 0, statuses


def test_with_no_replica_ready_haproxy_answers_in_the_envelope(tmp_path: Path) -> None:
    with postgres_database() as url, Cluster(tmp_path, url_string(url), None, replicas_n=1) as c:
        c.stop(0)
        r = httpx.post(f"{c.url}/v1/generate", json=GEN, verify=c.tls, timeout=30)
        assert r.status_code == 503
        err = r.json()["error"]
        assert err["type"] == "overloaded" and err["request_id"] == r.headers["x-request-id"]
        assert r.headers["retry-after"] == "1"


def test_a_store_that_takes_no_writes_costs_one_generation_per_call(cluster: Cluster) -> None:
    """With the store read-only, a response or a prediction is computed once and delivered (marked not stored),
    through HAProxy's retries and the official SDK's: no retryable 503 after work (it was 9 runs a call)."""
    import openai

    from sluicegate.api.routes.predictions import NOT_STORED
    from tests.store_faults import read_only

    def posts() -> list[tuple[str, int]]:
        out = []
        for r in cluster.replicas:
            for line in r.log_path.read_text(errors="replace").splitlines():
                if line.startswith("{") and '"access"' in line:
                    entry = json.loads(line)
                    if entry.get("method") == "POST" and entry.get("route") in ("/v1/responses", "/v1/predictions"):
                        out.append((entry["route"], entry["status"]))
        return out

    old = Counter(posts())
    before = sum(old.values())
    with read_only(cluster.database_url), httpx.Client(verify=cluster.tls, timeout=60) as http:
        client = openai.OpenAI(base_url=f"{cluster.url}/v1", api_key="unused", http_client=http, max_retries=2)
        for i in range(3):
            answer = client.responses.create(model="reference", input=f"store-less {i}", max_output_tokens=4)
            assert answer.store is False and answer.output_text is not None
        made = http.post(f"{cluster.url}/v1/predictions", json={"input": {"prompt": "x"},
                                                               "options": {"max_new_tokens": 2}})
        assert made.status_code == 200 and NOT_STORED in made.json()["warnings"]
    wait_for(lambda: len(posts()) >= before + 4, message="the four access lines")
    assert Counter(posts()) - old == Counter({("/v1/responses", 200): 3,
                                                                   ("/v1/predictions", 200): 1})


def test_an_idempotent_request_whose_replica_is_killed_is_answered_not_409(tmp_path: Path) -> None:
    """kill -9 of the replica running an Idempotency-Key request: HAProxy retries on the empty response, the
    replica it reaches waits for the dead claim's lease to run out, takes the work over and answers; a retry
    of the same key then replays that answer. (It ended in 409s: the dead replica's claim was held 60 s.)"""
    body = {"prompt": "Hello", "max_new_tokens": 120, "temperature": 0}
    key = {"Idempotency-Key": "crash-1"}
    with postgres_database() as url, Cluster(tmp_path, url_string(url), None,
                                             args=["--step-delay-ms", "40", "--eos-slope", "0"]) as c:
        got: list[httpx.Response] = []
        sender = threading.Thread(target=lambda: got.append(httpx.post(f"{c.url}/v1/generate", json=body, headers=key,
                                                                       verify=c.tls, timeout=120)))
        sender.start()

        def running_on() -> list[int]:
            return [r.index for r in c.replicas
                    if any(line.startswith("sluicegate_running{") and not line.endswith(" 0.0")
                           for line in httpx.get(f"{r.url}/metrics", timeout=10).text.splitlines())]

        (victim,) = wait_for(running_on, message="the request to be running on a replica")
        c.kill9(victim)
        sender.join(120)
        (answer,) = got
        assert answer.status_code == 200, answer.text
        assert len(answer.json()["token_ids"]) == 120
        again = httpx.post(f"{c.url}/v1/generate", json=body, headers=key, verify=c.tls, timeout=60)
        assert again.status_code == 200 and again.headers["idempotent-replayed"] == "true"
        assert again.json()["token_ids"] == answer.json()["token_ids"]
