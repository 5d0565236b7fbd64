"""`sluicegate jobs` against a server over a real socket, the key from SLUICEGATE_API_KEY or --key."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sluicegate.cli import main
from sluicegate.config import Config, JobsConfig
from sluicegate.store.migrate import upgrade
from sluicegate.tenancy.keys import Scope
from tests.api.auth_helpers import served
from tests.dbs import sqlite_url
from tests.jobs.helpers import chat_line, jsonl


def test_submit_watch_results_and_cancel(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    url = sqlite_url(tmp_path)
    upgrade(url)
    with served(url, Config(jobs=JobsConfig(poll_s=0.05))) as s:
        _key, secret = s.key(Scope.BATCH)
        monkeypatch.setenv("SLUICEGATE_API_KEY", secret)
        common = ["--url", s.url, "--interval", "0.05"]

        seed = tmp_path / "preds.jsonl"
        seed.write_bytes(jsonl([{"input": {"prompt": f"p{i}"}, "options": {"max_new_tokens": 2}} for i in range(4)]))
        assert main(["jobs", "submit", str(seed), "--watch", *common]) == 0
        out, err = capsys.readouterr()
        job_id = out.strip()
        assert job_id.startswith("batch_") and "4/4 (0 failed)" in err and "succeeded" in err
        res = tmp_path / "res.jsonl"
        assert main(["jobs", "results", job_id, "-o", str(res), *common]) == 0
        assert [json.loads(x)["line"] for x in res.read_text().splitlines()] == [1, 2, 3, 4]

        oa = tmp_path / "openai.jsonl"
        oa.write_bytes(jsonl([chat_line(i) for i in range(3)]))
        assert main(["jobs", "submit", str(oa), *common]) == 0
        batch_id = capsys.readouterr().out.strip()
        assert main(["jobs", "watch", batch_id, *common]) == 0
        assert "3/3" in capsys.readouterr().err
        assert main(["jobs", "results", batch_id, "-o", str(res), *common]) == 0
        assert sorted(json.loads(x)["custom_id"] for x in res.read_text().splitlines()) == ["req-0", "req-1", "req-2"]

        s.srv.runner.delay_s = 0.05
        slow = tmp_path / "slow.jsonl"
        slow.write_bytes(jsonl([{"input": {"prompt": "x"}, "options": {"max_new_tokens": 200}}] * 6))
        assert main(["jobs", "submit", str(slow), *common]) == 0
        slow_id = capsys.readouterr().out.strip()
        assert main(["jobs", "cancel", slow_id, *common]) == 0
        assert capsys.readouterr().out.strip() == "cancelled"

        monkeypatch.delenv("SLUICEGATE_API_KEY")
        assert main(["jobs", "watch", job_id, *common]) == 1
        assert "401 authentication_required" in capsys.readouterr().err
        assert main(["jobs", "watch", job_id, "--key", secret, *common]) == 0
