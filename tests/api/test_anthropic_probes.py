"""The probe suite's Messages surface (contract/probes_anthropic.py) against the in-process app: every probe
graded strictly (Anthropic's shape and statuses), zero 5xx, zero silent acceptances, nothing echoed."""

from __future__ import annotations

from sluicegate.contract.probe_runner import run_probes, totals
from sluicegate.contract.probes import ProbeOptions, all_probes, surfaces
from tests.conftest import make_client, wait_ready


def test_messages_probes_pass_strictly() -> None:
    assert "messages" in surfaces()
    probes = all_probes(ProbeOptions(model="reference"), only=["messages"])
    assert len(probes) >= 80 and sum(p.refuses for p in probes) >= 60
    with make_client() as c:
        wait_ready(c)
        results = run_probes(c, probes)
    assert [r.probe.name for r in results if r.server_error] == []
    assert [r.probe.name for r in results if r.silently_accepted] == []
    assert [r.probe.name for r in results if r.echoed] == []
    assert [(r.probe.name, r.status, r.error_type) for r in results if not r.passed(True)] == []
    assert totals(results).passed_strict == len(probes)
