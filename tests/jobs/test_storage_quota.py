"""Uploads per key over a real socket, on SQLite and Postgres: the stored-bytes quota (uploads and job outputs
together, checked as the upload streams and again once it is whole, so concurrent uploads cannot pass it
together), and the bound on a form's fields; each refusal in the envelope with its numbers."""

from __future__ import annotations

import io
from concurrent.futures import ThreadPoolExecutor

import httpx

from sluicegate.config import Config, JobsConfig
from sluicegate.tenancy.keys import Scope
from tests.api.auth_helpers import auth, served
from tests.jobs.helpers import chat_line, jsonl

QUOTA = JobsConfig(max_file_bytes=4000, max_stored_bytes=10_000, poll_s=0.05)


def body(size: int) -> bytes:
    line = jsonl([chat_line(0)])
    return line + b" " * (size - len(line))


def upload(url: str, secret: str, data: bytes, **fields: str) -> httpx.Response:
    return httpx.post(f"{url}/v1/files", files={"file": ("in.jsonl", io.BytesIO(data))},
                      data={"purpose": "batch", **fields}, headers=auth(secret), timeout=60)


def stored(url: str, secret: str) -> int:
    r = httpx.get(f"{url}/v1/files", headers=auth(secret), timeout=30)
    return sum(f["bytes"] for f in r.json()["data"])


def test_stored_bytes_quota_per_key(db_url: str) -> None:
    with served(db_url, Config(jobs=QUOTA)) as s:
        _, a = s.key(Scope.BATCH)
        _, b = s.key(Scope.BATCH)
        ids = [upload(s.url, a, body(3000)).json()["id"] for _ in range(3)]
        r = upload(s.url, a, body(2000))
        err = r.json()["error"]
        assert r.status_code == 413 and (err["code"], err["param"]) == ("storage_quota_exceeded", "file")
        assert "9000" in err["message"] and "10000" in err["message"] and "--batch-max-stored-bytes" in err["message"]
        assert stored(s.url, a) == 9000  # the refused upload left nothing behind
        assert upload(s.url, b, body(3000)).status_code == 200  # each key its own quota
        assert httpx.delete(f"{s.url}/v1/files/{ids[0]}", headers=auth(a), timeout=30).status_code == 200
        assert upload(s.url, a, body(2000)).status_code == 200 and stored(s.url, a) == 8000


def test_concurrent_uploads_never_pass_the_quota_together(db_url: str) -> None:
    with served(db_url, Config(jobs=QUOTA)) as s:
        _, a = s.key(Scope.BATCH)
        with ThreadPoolExecutor(8) as pool:
            codes = list(pool.map(lambda _: upload(s.url, a, body(3000)).status_code, range(8)))
        assert set(codes) <= {200, 413} and 1 <= codes.count(200) <= 3, codes
        assert stored(s.url, a) == 3000 * codes.count(200) <= QUOTA.max_stored_bytes


def test_form_fields_are_bounded(db_url: str) -> None:
    with served(db_url, Config(jobs=QUOTA)) as s:
        _, a = s.key(Scope.BATCH)
        assert upload(s.url, a, body(200), **{f"f{i}": "v" for i in range(15)}).status_code == 200
        r = upload(s.url, a, body(200), **{f"f{i}": "v" for i in range(100)})
        err = r.json()["error"]
        assert r.status_code == 400 and err["code"] == "too_many_fields" and "16" in err["message"]
        assert stored(s.url, a) == 200
