"""OpenTelemetry spans, captured with the SDK's in-memory exporter: one server span per request under the
caller's traceparent, auth, queue, prefill and decode inside it, upstream attempts forwarding the trace; every
span with the request id; and the OTEL_* variables deciding whether anything is recorded."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from sluicegate.config import Config
from sluicegate.telemetry import tracing
from tests.conftest import make_client, wait_ready
from tests.upstream.fake import FakeUpstream
from tests.upstream.test_faults import stack

TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT = "00f067aa0ba902b7"
TRACEPARENT = f"00-{TRACE}-{PARENT}-01"


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracing.install(provider)
    try:
        yield exporter
    finally:
        tracing.install(None)
        provider.shutdown()


def by_name(exporter: InMemorySpanExporter, request_id: str) -> dict[str, ReadableSpan]:
    out = {}
    for s in exporter.get_finished_spans():
        if (s.attributes or {}).get(tracing.REQUEST_ID) == request_id:
            out[s.name] = s
    return out


def test_a_request_is_one_trace_under_the_callers_traceparent(spans: InMemorySpanExporter) -> None:
    with make_client(Config()) as c:
        wait_ready(c)
        r = c.post("/v1/generate", json={"prompt": "Hello", "max_new_tokens": 3, "temperature": 0},
                   headers={"traceparent": TRACEPARENT})
        assert r.status_code == 200
    got = by_name(spans, r.headers["x-request-id"])
    assert {"POST /v1/generate", "auth", "queue", "prefill", "decode"} <= got.keys()
    server = got["POST /v1/generate"]
    assert format(server.context.trace_id, "032x") == TRACE
    assert server.parent is not None and format(server.parent.span_id, "016x") == PARENT
    assert (server.attributes or {})["http.response.status_code"] == 200
    for name in ("auth", "queue", "prefill", "decode"):
        span = got[name]
        assert span.parent is not None and span.parent.span_id == server.context.span_id, name
        assert span.context.trace_id == server.context.trace_id
    q, p, d = got["queue"], got["prefill"], got["decode"]
    assert q.end_time == p.start_time and p.end_time == d.start_time  # one run's stages, end to end
    assert server.start_time <= q.start_time and d.end_time <= server.end_time


def test_without_a_provider_nothing_is_recorded_and_the_callers_trace_goes_upstream_as_it_came() -> None:
    fake = FakeUpstream()
    with stack(fake) as url:
        r = httpx.post(f"{url}/v1/generate", json={"prompt": "Hello", "max_new_tokens": 2, "model": "fake"},
                       headers={"traceparent": TRACEPARENT}, timeout=60)
        assert r.status_code == 200
    assert fake.traceparents[-1] == TRACEPARENT


def test_an_upstream_attempt_is_a_span_whose_id_the_upstream_receives(spans: InMemorySpanExporter) -> None:
    fake = FakeUpstream()
    with stack(fake) as url:
        r = httpx.post(f"{url}/v1/generate", json={"prompt": "Hello", "max_new_tokens": 2, "model": "fake"},
                       headers={"traceparent": TRACEPARENT}, timeout=60)
        assert r.status_code == 200
    got = by_name(spans, r.headers["x-request-id"])
    upstream = got["upstream"]
    sent = fake.traceparents[-1].split("-")
    assert sent[1] == TRACE and sent[2] == format(upstream.context.span_id, "016x")
    assert upstream.parent is not None and upstream.parent.span_id == got["POST /v1/generate"].context.span_id


@pytest.mark.parametrize(("env", "on"), [
    ({}, False),
    ({"OTEL_TRACES_EXPORTER": "console"}, True),
    ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"}, True),
    ({"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"}, False),
    ({"OTEL_TRACES_EXPORTER": "otlp", "OTEL_SDK_DISABLED": "true"}, False),
])
def test_the_standard_variables_turn_tracing_on(env: dict[str, str], on: bool) -> None:
    try:
        provider = tracing.setup_from_environment(env)
        assert (provider is not None) == on == tracing.enabled()
        if provider is not None:
            provider.shutdown()
    finally:
        tracing.install(None)


def test_an_exporter_this_build_lacks_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match="OTEL_TRACES_EXPORTER=zipkin"):
        tracing.setup_from_environment({"OTEL_TRACES_EXPORTER": "zipkin"})
    with pytest.raises(ValueError, match="http/protobuf only"):
        tracing.setup_from_environment({"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"})
    assert not tracing.enabled()
