"""Webhook attempts that hold under a misbehaving receiver, over real sockets: an attempt is bounded as a
whole (not per read) and in the bytes it reads; one slow endpoint holds up no other key's deliveries and
gets at most `max_per_endpoint` at once; a replica never sends again what another still has in flight."""

from __future__ import annotations

import dataclasses

from sluicegate.config import Config
from sluicegate.tenancy.keys import Scope
from sluicegate.testing.wait import wait_for
from tests.api.auth_helpers import served
from tests.webhooks.receiver import receiver
from tests.webhooks.slow_receiver import slow_receiver
from tests.webhooks.test_webhooks_api import FAST, register, server, settled


def test_a_slow_endpoint_holds_up_no_other_key(db_url: str) -> None:
    """Key A's receiver answers 200 and trickles its body a byte every half second (two minutes in all, so
    no per-read timeout ever fires); key B's answers at once. B's event arrives while A's are still open,
    and A's endpoint never has more than `max_per_endpoint` attempts at once."""
    cfg = dataclasses.replace(FAST, timeout_s=300, max_per_endpoint=2)  # the attempt bound is not what is tested
    with slow_receiver("trickle_body", interval_s=0.5, length=240) as slow, receiver(204) as fast, \
            server(db_url, cfg) as (s, key_a, secret_a):
        key_b, secret_b = s.key(Scope.BATCH)
        assert register(s, secret_a, slow.url + "/slow").status_code == 201
        assert register(s, secret_b, fast.url + "/fast").status_code == 201
        for i in range(4):
            s.srv.state.webhooks.enqueue(key_a.id, "batch.completed", {"id": f"a{i}"}, subject="a", event_id=f"e{i}")
        wait_for(lambda: slow.count() >= 2)
        s.srv.state.webhooks.enqueue(key_b.id, "batch.completed", {"id": "b"}, subject="b")
        wait_for(lambda: settled(s, secret_b, "b") is not None or all(c.ended.is_set() for c in slow.conns))
        still_open = [not c.ended.is_set() for c in slow.conns]
        row = settled(s, secret_b, "b")
        assert row is not None and row["status"] == "delivered" and fast.count() == 1
        assert all(still_open), "B's event waited for A's slow endpoint"
        assert slow.most_open == 2 and slow.count() == 2  # the other two wait for a free place at A's endpoint


def test_an_attempt_is_bounded_as_a_whole_and_sent_by_one_replica(db_url: str) -> None:
    """The receiver sends its status line a byte every 0.4 s: each read comes well within the attempt's
    1.5 s, the whole answer does not. The attempt is cut (the receiver sees the client hang up) and recorded
    as timed out; the second replica sharing the database never sends it again."""
    cfg = dataclasses.replace(FAST, timeout_s=1.5, max_attempts=1)
    with slow_receiver("trickle_head", interval_s=0.4, length=0) as slow, server(db_url, cfg) as (s, key, secret), \
            served(db_url, Config(webhooks=cfg)):
        assert register(s, secret, slow.url + "/slow").status_code == 201
        s.srv.state.webhooks.enqueue(key.id, "batch.completed", {"id": "t"}, subject="t")
        wait_for(lambda: settled(s, secret, "t") is not None)
        row = settled(s, secret, "t")
        assert row is not None and row["status"] == "failed" and row["attempts"] == 1
        assert "timed out" in row["log"][0]["error"] and row["log"][0]["status_code"] is None
        assert slow.conns[0].ended.wait(60) and slow.conns[0].outcome == "hung up"
        assert slow.count() == 1


def test_a_huge_answer_is_not_read(db_url: str) -> None:
    """A 2xx with a 256 MiB body is delivered once its status is read; the body is not read past a few KiB
    (the receiver sees the client hang up long before it has written it all)."""
    with slow_receiver("flood", length=256 << 20) as flood, server(db_url) as (s, key, secret):
        assert register(s, secret, flood.url + "/big").status_code == 201
        s.srv.state.webhooks.enqueue(key.id, "batch.completed", {"id": "h"}, subject="h")
        wait_for(lambda: settled(s, secret, "h") is not None)
        row = settled(s, secret, "h")
        assert row is not None and row["status"] == "delivered" and row["last_status_code"] == 200
        assert flood.conns[0].ended.wait(60) and flood.conns[0].outcome == "hung up"
        assert flood.conns[0].written < 64 << 20  # what the sockets' buffers hold, not the body
