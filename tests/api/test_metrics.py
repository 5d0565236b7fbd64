"""`GET /metrics` through prometheus-client's own parser: HELP on every family, histograms for latencies,
`_total` counters, refusals by error type, and no percentile gauges (they cannot be summed across replicas)."""

from __future__ import annotations

from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from sluicegate.api.routes.metrics import parse_metrics

HISTOGRAMS = {
    "sluicegate_time_to_first_token_seconds", "sluicegate_inter_token_latency_seconds",
    "sluicegate_e2e_request_latency_seconds", "sluicegate_request_queue_time_seconds",
    "sluicegate_request_prefill_time_seconds", "sluicegate_request_decode_time_seconds", "sluicegate_step_seconds",
}


def test_exposition_parses_with_help_and_types(client: TestClient) -> None:
    before = parse_metrics(client.get("/metrics").text)
    r = client.post("/v1/generate", json={"prompt": "Hello", "max_new_tokens": 4, "temperature": 0})
    assert r.status_code == 200
    bad = client.post("/v1/generate", json={"prompt": "Hello", "max_new_tokens": 100000})
    assert bad.status_code == 422
    resp = client.get("/metrics")
    assert resp.status_code == 200 and resp.headers["content-type"].startswith("text/plain")
    families = {f.name: f for f in text_string_to_metric_families(resp.text)}
    ours = {n: f for n, f in families.items() if n.startswith("sluicegate_")}
    assert all(f.documentation for f in ours.values()), [n for n, f in ours.items() if not f.documentation]
    assert {n for n, f in ours.items() if f.type == "histogram"} >= HISTOGRAMS
    assert not any(n.endswith(("_p50", "_p95")) for n in ours)
    counters = {n for n, f in ours.items() if f.type == "counter"}
    assert {"sluicegate_generated_tokens", "sluicegate_prompt_tokens", "sluicegate_cached_tokens",
            "sluicegate_requests_finished", "sluicegate_request_errors"} <= counters
    assert {"sluicegate_running", "sluicegate_waiting", "sluicegate_kv_usage"} <= {
        n for n, f in ours.items() if f.type == "gauge"}
    assert "process_resident_memory_bytes" in families  # the process collector rides along
    after = parse_metrics(resp.text)
    assert after["sluicegate_ready"] == 1.0
    assert after["sluicegate_generated_tokens_total"] - before.get("sluicegate_generated_tokens_total", 0) == 4
    assert after["sluicegate_time_to_first_token_seconds_count"] >= 1
    key = 'sluicegate_requests_finished_total{finish_reason="length"}'
    assert after[key] - before.get(key, 0) == 1
    err = 'sluicegate_request_errors_total{type="context_length_exceeded"}'
    assert after[err] - before.get(err, 0) == 1
    assert all(s.name.endswith("_total") for n in counters for s in families[n].samples)  # no _created series


def test_the_gateway_inference_extension_reads_its_gauges(client: TestClient) -> None:
    """GIE's endpoint picker (llm-d) reads vLLM's names: the queue, the running sequences, the KV use (a fraction)
    and the prefix cache's block size, per model, equal to our own gauges."""
    assert client.post("/v1/generate", json={"prompt": "Hello", "max_new_tokens": 2}).status_code == 200
    families = {f.name: f for f in text_string_to_metric_families(client.get("/metrics").text)}
    ours = parse_metrics(client.get("/metrics").text)
    for gie, mine in (("vllm:num_requests_waiting", "sluicegate_waiting"),
                      ("vllm:num_requests_running", "sluicegate_running"),
                      ("vllm:kv_cache_usage_perc", "sluicegate_kv_usage")):
        (sample,) = families[gie].samples
        assert families[gie].type == "gauge" and sample.labels == {"model_name": "reference"}
        assert sample.value == ours[mine] and sample.value >= 0
    (info,) = families["vllm:cache_config_info"].samples
    assert info.labels == {"model_name": "reference", "block_size": "1"} and info.value == 1
