"""`GET /metrics`: Prometheus text format from prometheus-client. Never waits on the engine.

Two registries: the app's (readiness, and the engine's histograms, counters and gauges: engine/metrics.py)
and the process-wide default one (the error-envelope counter, process CPU, memory and file descriptors).
"""

from __future__ import annotations

from fastapi import APIRouter, Response
from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from sluicegate.api.services import Registry

router = APIRouter(tags=["operations"])


@router.get("/metrics", summary="Engine and process metrics (Prometheus text format)", response_class=Response)
async def metrics(registry: Registry) -> Response:
    body = generate_latest(registry) + generate_latest(REGISTRY)
    return Response(body, media_type=CONTENT_TYPE_LATEST)


def parse_metrics(text: str) -> dict[str, float]:
    """Read an exposition back with prometheus-client's parser (tests, benchmarks): one entry per sample,
    keyed by its name plus its labels other than `model_name` (`name{finish_reason="length"}`)."""
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            labels = {k: v for k, v in s.labels.items() if k != "model_name"}
            key = s.name + ("{" + ",".join(f'{k}="{v}"' for k, v in sorted(labels.items())) + "}" if labels else "")
            out[key] = s.value
    return out
