"""The probe suite's OpenAI surfaces (contract/probes_openai.py) against the in-process app: every probe
graded strictly, zero 5xx, zero silent acceptances, nothing echoed."""

from __future__ import annotations

from sluicegate.contract.probe_runner import run_probes, totals
from sluicegate.contract.probes import ProbeOptions, all_probes, surfaces
from tests.conftest import make_client, wait_ready


def test_openai_surfaces_are_registered() -> None:
    assert {"chat", "completions", "models"} <= set(surfaces())
    probes = all_probes(ProbeOptions(model="reference"), only=["chat", "completions", "models"])
    assert len(probes) >= 150 and sum(p.refuses for p in probes) >= 120


def test_openai_probes_pass_strictly() -> None:
    probes = all_probes(ProbeOptions(model="reference"), only=["chat", "completions", "models"])
    with make_client() as c:
        wait_ready(c)
        results = run_probes(c, probes)
    assert [r.probe.name for r in results if r.server_error] == []
    assert [r.probe.name for r in results if r.silently_accepted] == []
    assert [r.probe.name for r in results if r.echoed] == []
    assert [(r.probe.name, r.status, r.error_type) for r in results if not r.passed(True)] == []
    assert totals(results).passed_strict == len(probes)


def test_responses_probes_pass_strictly() -> None:
    probes = all_probes(ProbeOptions(model="reference"), only=["responses"])
    assert len(probes) >= 60 and sum(p.refuses for p in probes) >= 40
    with make_client() as c:
        wait_ready(c)
        results = run_probes(c, probes)
    assert [r.probe.name for r in results if r.server_error] == []
    assert [r.probe.name for r in results if r.silently_accepted] == []
    assert [r.probe.name for r in results if r.echoed] == []
    assert [(r.probe.name, r.status, r.error_type) for r in results if not r.passed(True)] == []
    assert totals(results).passed_strict == len(probes)
