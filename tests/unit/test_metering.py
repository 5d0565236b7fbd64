"""What each run of a request is charged (api/metering.py), from the engine's outputs and its progress."""

from __future__ import annotations

from typing import Any, cast

from sluicegate.api.metering import from_runs
from sluicegate.engine import EngineRequest, FinishReason, RequestOutput, SamplingParams
from sluicegate.serving.context import TokenUsage
from sluicegate.serving.core import Runs


def runs(*cases: tuple[int, int, int, RequestOutput | None, int]) -> Runs:
    """(prompt length, progress, cached progress, final, delivered) per run."""
    reqs = []
    for n, (length, done, cached, _, _) in enumerate(cases):
        r = EngineRequest(f"r{n}", list(range(length)), SamplingParams())
        r.progress.prompt_tokens, r.progress.cached_tokens = done, cached
        reqs.append(r)
    out = Runs(cast(Any, None), reqs, 0)
    out.finals = [c[3] for c in cases]
    out.delivered = [c[4] for c in cases]
    return out


def final(reason: FinishReason, prompt: int, cached: int, generated: int) -> RequestOutput:
    return RequestOutput("r", [], "", finished=True, finish_reason=reason, prompt_tokens=prompt,
                         cached_tokens=cached, completion_tokens=generated)


def test_finished_runs_count_as_reported() -> None:
    assert from_runs(runs((600, 600, 10, final(FinishReason.LENGTH, 600, 10, 7), 7))) == TokenUsage(600, 10, 7)


def test_a_run_cut_in_its_prefill_pays_what_was_prefilled() -> None:
    assert from_runs(runs((600, 512, 0, final(FinishReason.EXPIRED, 600, 0, 0), 0))) == TokenUsage(512, 0, 0)
    assert from_runs(runs((600, 512, 64, None, 0))) == TokenUsage(512, 64, 0)  # the client left
    assert from_runs(runs((600, 0, 0, final(FinishReason.EXPIRED, 600, 0, 0), 0))) == TokenUsage(0, 0, 0)  # queued
    assert from_runs(runs((600, 600, 0, None, 3))) == TokenUsage(600, 0, 3)  # left mid-generation


def test_several_runs_add_up() -> None:
    got = from_runs(runs((100, 100, 0, final(FinishReason.EOS, 100, 0, 5), 5), (100, 64, 0, None, 0)))
    assert got == TokenUsage(164, 0, 5)
