"""Batch items count against the key's monthly token budget: a batch cannot spend past `monthly_tokens`; the
items the budget cannot hold fail with 429 `budget_exceeded` and cost nothing."""

from __future__ import annotations

import httpx
from sqlalchemy import func, select

from sluicegate.config import Config, JobsConfig
from sluicegate.store.models import UsageRecord
from sluicegate.tenancy.keys import Scope, create_key
from tests.api.auth_helpers import auth, served
from tests.jobs.helpers import poll_seed

BUDGET = 30


def test_a_batch_cannot_spend_past_the_monthly_budget(db_url: str) -> None:
    with served(db_url, Config(jobs=JobsConfig(poll_s=0.05, worker_slots=1))) as s:
        key, secret = create_key(s.admin, "capped", {Scope.BATCH, Scope.GENERATE}, monthly_tokens=BUDGET)
        with httpx.Client(base_url=s.url, headers=auth(secret), timeout=30) as c:
            job = c.post("/v1/batch-predictions", json=[{"input": {"prompt": f"item {i}"},
                                                         "options": {"max_new_tokens": 4}} for i in range(8)])
            assert job.status_code == 202, job.text
            poll_seed(c, job.json()["id"])
            results = c.get(f"/v1/batch-predictions/{job.json()['id']}/results").json()["data"]
        ok = [r for r in results if r["status"] == "succeeded"]
        refused = [r for r in results if r["status"] == "failed"]
        assert ok and refused and len(ok) + len(refused) == 8
        assert all(r["error"]["type"] == "budget_exceeded" and r["error"]["code"] == "monthly_tokens" for r in refused)
        s.srv.state.tenancy.ledger.flush()
        with s.admin.session() as db:
            spent = db.scalar(select(func.sum(UsageRecord.prompt_tokens + UsageRecord.generated_tokens))
                              .where(UsageRecord.key_id == key.id))
        assert 0 < (spent or 0) <= BUDGET
        # and the key's interactive requests see the same month
        r = httpx.post(f"{s.url}/v1/generate", json={"prompt": "more", "max_new_tokens": 8}, headers=auth(secret),
                       timeout=30)
        assert r.status_code == 429 and r.json()["error"]["type"] == "budget_exceeded"
