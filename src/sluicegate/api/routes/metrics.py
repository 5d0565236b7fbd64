"""`GET /metrics`: the engine's counters and gauges in Prometheus text format. Never waits on the engine."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import PlainTextResponse

from sluicegate.api.state import app_state

router = APIRouter(tags=["operations"])

_COUNTERS = {
    "steps", "prompt_tokens", "cached_tokens", "generated_tokens", "requests_finished", "requests_cancelled",
    "requests_failed", "requests_refused",
}


@router.get("/metrics", summary="Engine metrics (Prometheus text format)", response_class=PlainTextResponse)
async def metrics(request: Request) -> PlainTextResponse:
    state = app_state(request)
    lines = [f"sluicegate_ready {1 if state.model is not None else 0}"]
    if state.engine is not None:
        for name, value in sorted(state.engine.stats.snapshot().items()):
            kind = "counter" if name in _COUNTERS else "gauge"
            metric = f"sluicegate_{name}_total" if kind == "counter" else f"sluicegate_{name}"
            lines += [f"# TYPE {metric} {kind}", f"{metric} {value:g}"]
    return PlainTextResponse("\n".join(lines) + "\n", media_type="text/plain; version=0.0.4")


def parse_metrics(text: str) -> dict[str, float]:
    """Read our own exposition back (for tests and benchmarks)."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            out[name] = float(value)
    return out
