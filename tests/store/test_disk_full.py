"""A full disk under the SQLite default: every write route answers 503 `store_unavailable` with Retry-After (the
batch and file routes answered 500), and a prediction made before its record could be written is delivered
with a warning, not turned into a 503 after the work. The disk is a small tmpfs, filled to the last byte."""

from __future__ import annotations

import io
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from sluicegate.api.routes.predictions import NOT_STORED
from sluicegate.config import Config, JobsConfig, WebhookConfig
from sluicegate.store.migrate import upgrade
from tests.api.auth_helpers import Served, served
from tests.jobs.helpers import chat_line, jsonl


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    disk = tmp_path / "disk"
    disk.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(disk)], capture_output=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here (needs root): {mounted.stderr.decode().strip()[:200]}")
    try:
        yield disk
    finally:
        subprocess.run(["umount", "-l", str(disk)], capture_output=True)


def _fill(disk: Path) -> None:
    """Fill the disk to the last byte (SQLite's next page write then fails: `database or disk is full`)."""
    with (disk / "filler").open("wb", buffering=0) as f:
        for size in (65536, 4096, 512, 1):
            try:
                while True:
                    f.write(b"\0" * size)
            except OSError:
                continue


def test_a_full_disk_is_a_503_on_every_write_route(small_disk: Path) -> None:
    url = f"sqlite:///{small_disk / 'store.db'}"
    upgrade(url)
    config = Config(jobs=JobsConfig(poll_s=0.05), webhooks=WebhookConfig(allow_networks=("192.0.2.0/24",)))
    with served(url, config) as s:
        before = httpx.post(f"{s.url}/v1/predictions", json={"input": {"prompt": "x"}}, timeout=60)
        assert before.status_code == 200 and before.json()["warnings"] == []
        _fill(small_disk)
        _judge(s)


def _judge(s: Served) -> None:
    with httpx.Client(base_url=s.url, timeout=60) as c:
        upload = io.BytesIO(jsonl([chat_line(i) for i in range(200)]))
        for r in (c.post("/v1/files", files={"file": ("a.jsonl", upload)}, data={"purpose": "batch"}),
                  c.post("/v1/batch-predictions", json=[{"input": {"prompt": "x" * 2000}} for _ in range(50)]),
                  c.post("/v1/webhook-endpoints", json={"url": "http://192.0.2.1/x",
                                                        "event_types": ["batch.completed"]}),
                  c.post("/v1/admin/keys", json={"name": "x" * 200})):
            assert r.status_code == 503 and r.headers.get("retry-after"), (r.request.url, r.text)
            assert r.json()["error"]["type"] == "store_unavailable"
        made = c.post("/v1/predictions", json={"input": {"prompt": "y" * 1500}, "options": {"max_new_tokens": 2}})
        assert made.status_code == 200 and NOT_STORED in made.json()["warnings"], made.text
        assert c.post("/v1/generate", json={"prompt": "z", "max_new_tokens": 2}).status_code == 200  # needs no store
