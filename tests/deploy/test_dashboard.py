"""deploy/grafana/sluicegate-dashboard.json asks only for metrics the server exports, under their exported names."""

from __future__ import annotations

import json
import re
from pathlib import Path

from tests.conftest import make_client, wait_ready

DASHBOARD = Path(__file__).resolve().parents[2] / "deploy" / "grafana" / "sluicegate-dashboard.json"


def test_every_sluicegate_series_in_the_dashboard_is_exported() -> None:
    dash = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in dash["panels"] for t in p["targets"]]
    assert exprs and all(p["datasource"]["uid"] == "${datasource}" for p in dash["panels"])
    wanted = {m for e in exprs for m in re.findall(r"\b((?:sluicegate|process)_[a-z_]+)\b", e)}
    with make_client() as c:
        wait_ready(c)
        c.post("/v1/generate", json={"prompt": "hi", "max_new_tokens": 2})
        c.post("/v1/generate", json={"prompt": "hi", "max_new_tokens": 0})  # an error envelope, counted
        exported = set(re.findall(r"^([a-z_]+)(?:\{| )", c.get("/metrics").text, re.M))
    missing = sorted(wanted - exported)
    assert not missing, f"the dashboard asks for series /metrics does not have: {missing}"
    assert {"sluicegate_time_to_first_token_seconds_bucket", "sluicegate_request_errors_total"} <= wanted
