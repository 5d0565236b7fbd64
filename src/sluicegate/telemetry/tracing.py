"""OpenTelemetry traces, configured by the standard `OTEL_*` variables.

On when `OTEL_TRACES_EXPORTER` names an exporter (`otlp`: OTLP over HTTP/protobuf to
`OTEL_EXPORTER_OTLP_ENDPOINT`, default http://localhost:4318; `console`: stdout), or when an OTLP endpoint
variable is set; off otherwise, with `OTEL_TRACES_EXPORTER=none`, or with `OTEL_SDK_DISABLED=true`. The SDK reads
the rest itself (`OTEL_SERVICE_NAME`, default `sluicegate`; `OTEL_RESOURCE_ATTRIBUTES`; `OTEL_TRACES_SAMPLER`;
the exporter's headers and timeouts).

Spans: one server span per request (`POST /v1/chat/completions`, a child of the caller's W3C `traceparent` when
it sent one), and inside it `auth`, `queue`, `prefill` and `decode` for each engine run, and `upstream` for each
attempt at an upstream engine, whose request carries our `traceparent`. Every span has the request id
(`sluicegate.request_id`), so the id a customer quotes finds the trace, and every log line of the request (the
JSON log has `request_id`, `trace_id` and `span_id`). The engine stays free of any of this: its stages are
recorded when the run's final output reaches the serving layer, from the durations the engine measured, ending
then (the engine thread's hand-off is well under a millisecond).

Off, nothing is recorded and a span costs one check; a caller's `traceparent` is still forwarded upstream as it
came, so a trace passes through an untraced sluicegate unbroken.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

from opentelemetry import trace

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider

log = logging.getLogger("sluicegate")
REQUEST_ID = "sluicegate.request_id"
_provider: TracerProvider | None = None


def install(provider: TracerProvider | None) -> None:
    """Record spans with `provider` (None: stop). Tests install one with an in-memory exporter."""
    global _provider
    _provider = provider


def enabled() -> bool:
    return _provider is not None


def tracer() -> trace.Tracer:
    assert _provider is not None
    return _provider.get_tracer("sluicegate")


def _wanted(environ: Mapping[str, str]) -> list[str]:
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return []
    names = [n.strip().lower() for n in environ.get("OTEL_TRACES_EXPORTER", "").split(",") if n.strip()]
    if not names and (environ.get("OTEL_EXPORTER_OTLP_ENDPOINT") or environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")):
        names = ["otlp"]
    return [n for n in names if n != "none"]


def setup_from_environment(environ: Mapping[str, str] | None = None) -> TracerProvider | None:
    """Install a provider as the OTEL_* variables ask (module doc); None when tracing stays off. An exporter
    this build does not ship is refused with ValueError naming it."""
    env = os.environ if environ is None else environ
    names = _wanted(env)
    if not names:
        return None
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter, SpanExporter

    exporters: list[SpanExporter] = []
    for name in names:
        if name == "otlp":
            protocol = env.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") or env.get("OTEL_EXPORTER_OTLP_PROTOCOL")
            if protocol and protocol != "http/protobuf":
                raise ValueError(f"OTEL_EXPORTER_OTLP_PROTOCOL={protocol}: this build exports OTLP over "
                                 "http/protobuf only")
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

            exporters.append(OTLPSpanExporter())
        elif name == "console":
            exporters.append(ConsoleSpanExporter())
        else:
            raise ValueError(f"OTEL_TRACES_EXPORTER={name}: the exporters are otlp, console and none")
    attrs: dict[str, Any] = {} if env.get("OTEL_SERVICE_NAME") else {"service.name": "sluicegate"}
    provider = TracerProvider(resource=Resource.create(attrs))
    for exporter in exporters:
        provider.add_span_processor(BatchSpanProcessor(exporter))
    install(provider)
    log.info("tracing: exporting spans (%s)", ", ".join(names))
    return provider


@contextlib.contextmanager
def span(name: str, request_id: str, **attributes: Any) -> Iterator[trace.Span | None]:
    """A child span of the current one while the block runs; nothing when tracing is off."""
    if _provider is None:
        yield None
        return
    with tracer().start_as_current_span(name, attributes={REQUEST_ID: request_id, **attributes}) as s:
        yield s


def engine_stages(request_id: str, run: int, queue_ms: float, prefill_ms: float, decode_ms: float) -> None:
    """One run's `queue`, `prefill` and `decode` spans, ending now, from the durations the engine measured."""
    if _provider is None:
        return
    t = tracer()
    end = time.time_ns()
    cuts = [end - int((decode_ms + prefill_ms + queue_ms) * 1e6), end - int((decode_ms + prefill_ms) * 1e6),
            end - int(decode_ms * 1e6), end]
    # The engine's queue clock starts when the request arrived, a few microseconds before the server span did, and
    # the wall clock is not the monotonic one it measured with: a stage never starts before the span it is under.
    floor = getattr(trace.get_current_span(), "start_time", None)
    if isinstance(floor, int):
        cuts = [max(c, floor) for c in cuts]
    for k, name in enumerate(("queue", "prefill", "decode")):
        s = t.start_span(name, start_time=cuts[k], attributes={REQUEST_ID: request_id, "sluicegate.run": run})
        s.end(end_time=cuts[k + 1])


def inject(headers: dict[str, str]) -> dict[str, str]:
    """`headers` with the current trace context added (`traceparent`, `tracestate`): ours when tracing, else the
    caller's as it came."""
    from opentelemetry.propagate import inject as _inject

    _inject(headers)
    return headers


__all__ = ["REQUEST_ID", "enabled", "engine_stages", "inject", "install", "setup_from_environment", "span",
           "tracer"]
