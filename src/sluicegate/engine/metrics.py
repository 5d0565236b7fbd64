"""The engine's Prometheus metrics (prometheus-client), in a registry of its own.

Latencies are histograms, not percentile gauges: histograms from many replicas add up (a p95 gauge per
replica cannot be combined). Bucket boundaries follow vLLM's (`vllm/v1/metrics/loggers.py`) with finer ones
below 10 ms added to the token-latency histograms, where a small model on a CPU lives (a decode step is
5-10 ms here). Counters and gauges the engine already keeps under its lock (`EngineStats`) are read at
scrape time by a collector instead of being written twice; every series carries `model_name`.

Names: `sluicegate_` and underscores only (colons trouble some exporters); prometheus-client adds `_total`
to counters; no `_created` series (they double the series count for nothing a dashboard uses).
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram, disable_created_metrics
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from sluicegate.engine.stats import COUNTER_HELP, GAUGE_HELP, LABELLED, LABELLED_HELP, EngineStats

disable_created_metrics()  # type: ignore[no-untyped-call]

TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
                40.0, 80.0, 160.0, 640.0, 2560.0)
TOKEN_BUCKETS = (0.001, 0.0025, 0.005, 0.0075, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75,
                 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0)
REQUEST_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0,
                   240.0, 480.0, 960.0, 1920.0, 7680.0)
FORECAST_BUCKETS = (0.25, 0.5, 0.67, 0.8, 0.9, 0.95, 1.0, 1.05, 1.1, 1.25, 1.5, 2.0, 4.0)
RESTORE_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0)
STEP_BUCKETS = (0.001, 0.0025, 0.005, 0.0075, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


class _StatsCollector(Collector):
    """Exposes every engine's EngineStats counters and gauges (one engine per served model), read under their
    lock at scrape time: one family per name, a sample per model."""

    def __init__(self) -> None:
        self._engines: list[tuple[EngineStats, str]] = []

    def add(self, stats: EngineStats, model_name: str) -> None:
        self._engines.append((stats, model_name))

    def remove(self, stats: EngineStats) -> None:
        self._engines = [(s, m) for s, m in self._engines if s is not stats]

    def collect(self) -> Iterator[Metric]:
        snaps = [(stats.snapshot(), model) for stats, model in self._engines]
        for name, text in COUNTER_HELP.items():
            c = CounterMetricFamily(f"sluicegate_{name}", text, labels=["model_name"])
            for snap, model in snaps:
                c.add_metric([model], snap[name])
            yield c
        for name, text in LABELLED_HELP.items():
            label, fields = LABELLED[name]
            c = CounterMetricFamily(f"sluicegate_{name}", text, labels=["model_name", label])
            for snap, model in snaps:
                for value, key in fields.items():
                    c.add_metric([model, value], snap[key])
            yield c
        for name, text in GAUGE_HELP.items():
            g = GaugeMetricFamily(f"sluicegate_{name}", text, labels=["model_name"])
            for snap, model in snaps:
                g.add_metric([model], snap[name])
            yield g
        yield from gie_families(snaps)


# GIE's model-server protocol (the Gateway API Inference Extension's endpoint picker, which llm-d uses) reads
# vLLM's names: the same gauges again under them, so a pool of replicas can sit behind it unmodified
# (docs/deploy.md). The colon is theirs; every other series keeps `sluicegate_` and underscores.
GIE_GAUGES = {
    "vllm:num_requests_waiting": ("waiting", "requests waiting for a slot (sluicegate_waiting)"),
    "vllm:num_requests_running": ("running", "sequences holding a slot (sluicegate_running)"),
    "vllm:kv_cache_usage_perc": ("kv_usage", "KV positions in use, a fraction from 0 to 1 as vLLM reports it "
                                 "(sluicegate_kv_usage)"),
}
PREFIX_BLOCK_TOKENS = 1  # the prefix cache matches token by token (engine/radix.py): its block is one token


def gie_families(snaps: list[tuple[dict[str, float], str]]) -> Iterator[Metric]:
    for name, (field, text) in GIE_GAUGES.items():
        g = GaugeMetricFamily(name, text, labels=["model_name"])
        for snap, model in snaps:
            g.add_metric([model], snap[field])
        yield g
    info = GaugeMetricFamily("vllm:cache_config_info", "the KV cache's configuration (GIE reads block_size, in "
                             "tokens, for its prefix-aware scorer); always 1", labels=["model_name", "block_size"])
    for _, model in snaps:
        info.add_metric([model, str(PREFIX_BLOCK_TOKENS)], 1.0)
    yield info


class _Families:
    """The histograms and counters of one registry, shared by every engine that reports into it (one per served
    model, each its own `model_name`)."""

    def __init__(self, r: CollectorRegistry) -> None:
        labels = ["model_name"]

        def hist(name: str, text: str, buckets: tuple[float, ...]) -> Histogram:
            return Histogram(f"sluicegate_{name}", text, labels, buckets=buckets, registry=r)

        self.ttft = hist("time_to_first_token_seconds", "arrival to first generated token", TTFT_BUCKETS)
        self.itl = hist("inter_token_latency_seconds", "between a stream's consecutive tokens", TOKEN_BUCKETS)
        self.e2e = hist("e2e_request_latency_seconds", "arrival to the request's end, every way out", REQUEST_BUCKETS)
        self.queue = hist("request_queue_time_seconds", "arrival to first scheduled step", REQUEST_BUCKETS)
        self.prefill = hist("request_prefill_time_seconds", "first scheduled step to first token", REQUEST_BUCKETS)
        self.decode = hist("request_decode_time_seconds", "first token to the end", REQUEST_BUCKETS)
        self.step = hist("step_seconds", "one engine step: forward pass and sampling", STEP_BUCKETS)
        self.kv_restore = hist("kv_tier_restore_seconds", "restoring one slot's KV from the host-memory KV tier",
                               RESTORE_BUCKETS)
        self.forecast_error = hist("forecast_error_ratio", "deadline admission's forecast of a run's latency over "
                                   "the latency it had (1: exact), at the tokens it generated; runs that ended "
                                   "normally, as of the last admission that changed it (docs/timeouts.md)",
                                   FORECAST_BUCKETS)
        self.admission_forecast_error = hist(
            "admission_forecast_error_ratio", "the same, of the forecast made when the request was admitted (the "
            "requests admitted after it, which it had to foresee, included)", FORECAST_BUCKETS)
        self.finished = Counter("sluicegate_requests_finished", "requests ended, by finish reason (every way "
                                "out: cancelled, expired and error included)", ["model_name", "finish_reason"],
                                registry=r)
        self.stats = _StatsCollector()
        r.register(self.stats)


_FAMILIES: weakref.WeakKeyDictionary[CollectorRegistry, _Families] = weakref.WeakKeyDictionary()
_LOCK = threading.Lock()


class EngineMetrics:
    """What the engine thread observes per token, step and request (each observation is ~1 µs)."""

    def __init__(self, stats: EngineStats, model_name: str = "", registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        with _LOCK:
            fam = _FAMILIES.get(self.registry)
            if fam is None:
                fam = _FAMILIES[self.registry] = _Families(self.registry)
        m = model_name
        self.ttft, self.itl, self.e2e = fam.ttft.labels(m), fam.itl.labels(m), fam.e2e.labels(m)
        self.queue, self.prefill, self.decode = fam.queue.labels(m), fam.prefill.labels(m), fam.decode.labels(m)
        self.step, self.kv_restore = fam.step.labels(m), fam.kv_restore.labels(m)
        self.forecast_error = fam.forecast_error.labels(m)
        self.admission_forecast_error = fam.admission_forecast_error.labels(m)
        self._finished = fam.finished
        self._model = m
        self._stats, self._collector = stats, fam.stats
        fam.stats.add(stats, m)

    def detach(self) -> None:
        """The engine is gone (its model unloaded): its gauges and counters leave the scrape; a model loaded again
        reports from zero, as after a restart (Prometheus' rate() reads the reset)."""
        self._collector.remove(self._stats)

    def finished(self, reason: str) -> None:
        self._finished.labels(self._model, reason).inc()
