"""A list cursor never tells whether another key's object exists: `after` naming another key's file, batch or
batch prediction is answered exactly as a made-up id is (400 or 422 `invalid_cursor`), and one of the caller's
own pages on as before."""

from __future__ import annotations

import io
from typing import Any

import httpx

from sluicegate.config import Config, JobsConfig
from sluicegate.tenancy.keys import Scope
from tests.api.auth_helpers import auth, served
from tests.jobs.helpers import chat_line, jsonl

CONFIG = Config(jobs=JobsConfig(poll_s=0.05))


def _shape(r: httpx.Response) -> tuple[int, Any, Any]:
    body = r.json()
    err = body.get("error")
    return r.status_code, err and (err["type"], err["code"], err["param"], err["message"]), body.get("data")


def test_another_keys_id_as_a_cursor_answers_as_a_made_up_one(db_url: str) -> None:
    with served(db_url, CONFIG) as s:
        _a, a = s.key(Scope.BATCH, Scope.GENERATE)
        _b, b = s.key(Scope.BATCH, Scope.GENERATE)
        with httpx.Client(base_url=s.url, headers=auth(b), timeout=30) as mine, \
                httpx.Client(base_url=s.url, headers=auth(a), timeout=30) as theirs:
            _check(mine, theirs)


def _check(mine: httpx.Client, theirs: httpx.Client) -> None:
    def upload(c: httpx.Client) -> dict[str, Any]:
        r = c.post("/v1/files", files={"file": ("x.jsonl", io.BytesIO(jsonl([chat_line(1)])))},
                   data={"purpose": "batch"})
        assert r.status_code == 200, r.text
        return dict(r.json())

    def batch(c: httpx.Client, file_id: str) -> str:
        r = c.post("/v1/batches", json={"input_file_id": file_id, "endpoint": "/v1/chat/completions",
                                         "completion_window": "24h"})
        assert r.status_code == 200, r.text
        return str(r.json()["id"])

    def seed(c: httpx.Client) -> str:
        r = c.post("/v1/batch-predictions", json=[{"input": {"prompt": "x"}, "options": {"max_new_tokens": 1}}])
        assert r.status_code == 202, r.text
        return str(r.json()["id"])

    foreign_file = upload(theirs)["id"]
    foreign = {"/v1/files": foreign_file, "/v1/batches": batch(theirs, foreign_file),
               "/v1/batch-predictions": seed(theirs)}
    own_files = [upload(mine)["id"] for _ in range(2)]
    batch(mine, own_files[0])
    seed(mine)
    # lists are newest first: after the newest of two, one is left
    own = {"/v1/files": own_files[1], "/v1/batches": batch(mine, own_files[1]), "/v1/batch-predictions": seed(mine)}
    for path, foreign_id in foreign.items():
        made_up = foreign_id[:-4] + ("0000" if not foreign_id.endswith("0000") else "1111")
        got = _shape(mine.get(path, params={"after": foreign_id}))
        assert got[0] in (400, 422) and got[1][1] == "invalid_cursor" and got[1][2] == "after", (path, got)
        unknown = _shape(mine.get(path, params={"after": made_up}))
        assert got == unknown, path
        page = mine.get(path, params={"after": own[path]})
        assert page.status_code == 200 and len(page.json()["data"]) == 1, (path, page.text)
