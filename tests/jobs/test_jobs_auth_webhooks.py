"""Batch jobs with API keys, on SQLite and Postgres: the `batch` scope, a job and its files invisible to
another key (404), batch tokens in the key's usage ledger, and a signed webhook at each job's end for both
shapes (batch.completed; batch.failed for a batch that failed validation), verified with the Standard
Webhooks verifier."""

from __future__ import annotations

import io
import json
from typing import Any

import httpx
from standardwebhooks import Webhook

from sluicegate.config import Config, JobsConfig, WebhookConfig
from sluicegate.tenancy.keys import Scope
from sluicegate.testing.wait import wait_for
from tests.api.auth_helpers import auth, served
from tests.jobs.helpers import FINAL_OPENAI, chat_line, jsonl, poll_seed
from tests.webhooks.receiver import receiver

CONFIG = Config(jobs=JobsConfig(poll_s=0.05),
                webhooks=WebhookConfig(allow_networks=("127.0.0.0/8",), backoff_base_s=0.01, poll_s=0.05))


def test_scope_isolation_usage_and_webhooks(db_url: str) -> None:
    with receiver(204) as rx, served(db_url, CONFIG) as s:
        _key, secret = s.key(Scope.BATCH, Scope.GENERATE)
        _other, other_secret = s.key(Scope.BATCH)
        _gen_only, gen_secret = s.key(Scope.GENERATE)
        me = httpx.Client(base_url=s.url, headers=auth(secret), timeout=30)
        other = httpx.Client(base_url=s.url, headers=auth(other_secret), timeout=30)
        hook = me.post("/v1/webhook-endpoints", json={"url": rx.url + "/hook",
                                                      "event_types": ["batch.completed", "batch.failed"]})
        assert hook.status_code == 201, hook.text
        verifier = Webhook(hook.json()["secret"])

        r = httpx.post(f"{s.url}/v1/batch-predictions", json=[{"input": {"prompt": "x"}}], headers=auth(gen_secret))
        assert r.status_code == 403 and r.json()["error"]["type"] == "permission_denied"
        assert httpx.get(f"{s.url}/v1/files", headers=auth(gen_secret)).status_code == 403

        f = me.post("/v1/files", files={"file": ("a.jsonl", io.BytesIO(jsonl([chat_line(i) for i in range(3)])))},
                    data={"purpose": "batch"}).json()
        assert other.get(f"/v1/files/{f['id']}").status_code == 404
        assert other.get(f"/v1/files/{f['id']}/content").status_code == 404
        assert other.get("/v1/files").json()["data"] == []
        b = me.post("/v1/batches", json={"input_file_id": f["id"], "endpoint": "/v1/chat/completions",
                                         "completion_window": "24h"}).json()
        assert other.post("/v1/batches", json={"input_file_id": f["id"], "endpoint": "/v1/chat/completions",
                                               "completion_window": "24h"}).status_code == 404
        assert other.get(f"/v1/batches/{b['id']}").status_code == 404
        assert other.post(f"/v1/batches/{b['id']}/cancel").status_code == 404

        bad = me.post("/v1/files", files={"file": ("b.jsonl", io.BytesIO(b"{oops\n"))}, data={"purpose": "batch"})
        failed = me.post("/v1/batches", json={"input_file_id": bad.json()["id"], "endpoint": "/v1/chat/completions",
                                              "completion_window": "24h"}).json()
        assert failed["status"] == "failed"

        seed = me.post("/v1/batch-predictions", json=[{"input": {"prompt": "y"}, "options": {"max_new_tokens": 2}}])
        assert other.get(f"/v1/batch-predictions/{seed.json()['id']}").status_code == 404
        assert other.delete(f"/v1/batch-predictions/{seed.json()['id']}").status_code == 404
        done = wait_for(lambda: (x := me.get(f"/v1/batches/{b['id']}").json())["status"] in FINAL_OPENAI and x)
        assert done["status"] == "completed"
        assert poll_seed(me, seed.json()["id"])["status"] == "succeeded"

        def events() -> list[dict[str, Any]] | None:
            got = [json.loads(x.body) for x in rx.got]
            return got if len(got) >= 3 else None

        got = wait_for(events, message="three webhook deliveries")
        assert sorted((e["type"], e["data"]["id"]) for e in got) == sorted(
            [("batch.completed", b["id"]), ("batch.completed", seed.json()["id"]), ("batch.failed", failed["id"])])
        for req in rx.got:
            verifier.verify(req.body, req.headers)  # raises on a bad signature

        usage = me.get("/v1/usage").json()
        assert usage["data"], usage
        day = usage["data"][0]
        assert day["requests"] >= 4 and day["generated_tokens"] >= 4  # 3 chat items + 1 prediction, in the ledger
        me.close()
        other.close()
