"""A caller-supplied request id is kept per key: a key sending another key's request id as `X-Request-Id` gets
it echoed as any caller does, but the usage ledger never records one id for two keys' requests."""

from __future__ import annotations

import httpx
from sqlalchemy import select

from sluicegate.store.models import UsageRecord
from sluicegate.tenancy.keys import Scope
from tests.api.auth_helpers import GEN, auth, served


def test_two_keys_sending_one_request_id_never_share_a_ledger_row(db_url: str) -> None:
    with served(db_url) as s:
        a_key, a = s.key(Scope.GENERATE)
        b_key, b = s.key(Scope.GENERATE)
        first = httpx.post(f"{s.url}/v1/generate", json=GEN, headers=auth(a), timeout=30)
        rid = first.headers["x-request-id"]  # the server's id for a's request, which b has learnt
        stolen = httpx.post(f"{s.url}/v1/generate", json=GEN, headers={**auth(b), "X-Request-Id": rid}, timeout=30)
        assert stolen.status_code == 200 and stolen.headers["x-request-id"] == rid  # echoed, as documented
        chosen = httpx.post(f"{s.url}/v1/generate", json=GEN, headers={**auth(a), "X-Request-Id": "order-1"},
                            timeout=30)
        assert chosen.headers["x-request-id"] == "order-1"
        s.srv.state.tenancy.ledger.flush()
        with s.admin.session() as db:
            rows = db.execute(select(UsageRecord.key_id, UsageRecord.request_id)).all()
        ids = {key: sorted(r for k, r in rows if k == key) for key in (a_key.id, b_key.id)}
        assert ids[a_key.id] == sorted([rid, f"{a_key.id}:order-1"])
        assert ids[b_key.id] == [f"{b_key.id}:{rid}"]
        assert not set(ids[a_key.id]) & set(ids[b_key.id])
