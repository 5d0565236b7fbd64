"""The settings of `serve`, one group per concern, each field named after its long flag.

`--max-new-tokens` is `max_new_tokens` here, `max_new_tokens = 512` in the TOML file and
`SLUICEGATE_MAX_NEW_TOKENS` in the environment. The default of each field is the default of the frozen
configuration it becomes (settings/convert.py), read from there, so the two cannot drift apart. The
`description` is the flag's `--help`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, ClassVar

from pydantic import BaseModel, Field
from pydantic_settings import NoDecode

from sluicegate.config import (
    ConnectionConfig,
    DeadlineConfig,
    IdempotencyConfig,
    JobsConfig,
    LimitsConfig,
    ModelConfig,
    RateLimitConfig,
    StoreConfig,
    UpstreamConfig,
    UpstreamModel,
    WebhookConfig,
)
from sluicegate.engine.scheduler import SchedulerConfig
from sluicegate.errorcatalog import DEFAULT_DOCS_URL
from sluicegate.settings import types as t
from sluicegate.settings.flag import Flag

_M, _E, _L, _D, _C = ModelConfig(), SchedulerConfig(), LimitsConfig(), DeadlineConfig(), ConnectionConfig()
_S, _R, _J, _W, _U = StoreConfig(), RateLimitConfig(), JobsConfig(), WebhookConfig(), UpstreamConfig()

PosInt = Annotated[int, Flag(t.positive_int, "N")]
OptPosInt = Annotated[int | None, Flag(t.positive_int, "N")]
NonNegInt = Annotated[int, Flag(t.nonnegative_int, "N")]
Seconds = Annotated[float, Flag(t.positive_seconds, "SECONDS")]
Hours = Annotated[float, Flag(t.positive_hours, "HOURS")]
Bool = Annotated[bool, Flag(t.flag_bool)]
Text = Annotated[str, Flag(t.text)]
OptText = Annotated[str | None, Flag(t.text)]
Secret = Annotated[str | None, Flag(t.text, "VALUE", secret=True)]
SecretUrl = Annotated[str | None, Flag(t.text, "URL", secret=True)]


class Group(BaseModel):
    TITLE: ClassVar[str] = ""


class ModelSettings(Group):
    TITLE = "the model and the engine (docs/engine.md)"
    model: Annotated[Path | None, Flag(Path, "GGUF")] = Field(
        None, description="GGUF file (default: SmolLM2-135M-Instruct Q4_1)")
    name: OptText = Field(None, description="served model name")
    model_version: OptText = Field(None, description="served model version")
    ctx: PosInt = Field(_M.n_ctx, description="context window per request, in tokens")
    slots: PosInt = Field(_M.n_slots, description="sequences decoded together")
    threads: OptPosInt = Field(
        None, description="most CPU threads for compute (default: the usable cores: affinity and cgroup quota)")
    adaptive_threads: Bool = Field(
        _M.adaptive_threads, description="use fewer threads while other processes hold cores (default: on)")
    flash_attn: Bool = Field(
        _M.flash_attn, description="llama.cpp flash attention, every call kept on its one-row path: outputs never "
        "depend on batching, and a conversation's earlier replies are reused from the cache (default: on; "
        "--no-flash-attn: the plain attention kernels)")
    speculative_ngram: Annotated[str | int, Flag(t.speculative, "auto|K")] = Field(
        "auto", description="speculative decoding for greedy requests, prompt-lookup drafts verified in one step. "
        f"auto (the default): only where verification is exact (flash attention), at most {_E.speculative_auto} "
        "drafts and only as many as the measured cost of a row says pay; K: up to K drafts whenever a match is "
        "found; 0: off")
    prompt_lookup_max: PosInt = Field(
        _E.prompt_lookup_max, description="speculative decoding: longest n-gram matched to find drafts")
    prompt_lookup_min: PosInt = Field(_E.prompt_lookup_min, description="speculative decoding: shortest n-gram matched")
    kv_cache_bytes: Annotated[int | None, Flag(t.nonnegative_int, "BYTES")] = Field(
        _E.kv_cache_bytes, description="host memory for evicted slots' KV, restored when their conversation returns "
        "instead of prefilled again (default: off; an eighth of the machine's memory is a sensible budget; "
        "docs/engine.md, KV tier)")


class HttpSettings(Group):
    TITLE = "listening, browsers and logs"
    host: Text = Field("127.0.0.1", description="listen address (0.0.0.0: every interface)")
    port: Annotated[int, Flag(t.port, "PORT")] = Field(8000, description="listen port")
    allowed_hosts: Annotated[list[str] | None, NoDecode, Flag(t.host_pattern, "HOST[,HOST...]", repeat=True)] = Field(
        None, description="Host header names served, comma-separated or repeated (`*.example.com`: its subdomains; "
        "`*`: any). Default: on a loopback --host only localhost, 127.0.0.1 and [::1] (DNS rebinding "
        "protection); on 0.0.0.0 or another address, any")
    cors_origin: Annotated[list[str], NoDecode, Flag(t.cors_origin, "ORIGIN", repeat=True)] = Field(
        [], description="a browser origin (https://app.example.com) whose pages may call this server, repeatable; "
        "`*`: any origin (default: none, so browsers refuse other origins' pages)")
    error_docs_url: Annotated[str, Flag(t.docs_url, "URL")] = Field(
        DEFAULT_DOCS_URL, description="where the error catalog (docs/errors.md) is published: every error's "
        "docs_url is this and the anchor of its type or code (default: the project's main branch on GitHub)")
    log_level: Annotated[str, Flag(t.log_level, "|".join(t.LOG_LEVELS))] = Field(
        "info", description="the least severe log line written")
    log_format: Annotated[str, Flag(t.log_format, "|".join(t.LOG_FORMATS))] = Field(
        "text", description="text: a line for people; json: one JSON object a line (the access log line carries "
        "the request id, key id, route, status, tokens and stage times)")


class LimitSettings(Group):
    TITLE = "limits every surface shares (docs/serving.md, docs/timeouts.md)"
    max_body_bytes: PosInt = Field(_L.max_body_bytes, description="request body limit, in bytes")
    max_prompt_tokens: OptPosInt = Field(
        _L.max_prompt_tokens, description="prompt tokens one request may send (default: the window minus one)")
    max_new_tokens: PosInt = Field(
        _L.max_new_tokens, description="new tokens one request may ask for (the window bounds it too)")
    estimate_new_tokens: PosInt = Field(
        _L.estimate_new_tokens, description="new tokens the cost estimate assumes for a request that sets no limit")
    drain_seconds: Annotated[float, Flag(t.nonnegative_seconds, "SECONDS")] = Field(
        _L.drain_s, description="on SIGTERM, how long in-flight requests may finish before they are cut")
    default_timeout: Annotated[float | None, Flag(t.seconds_or_none, "SECONDS")] = Field(
        _D.default_timeout_s, description="time budget of a request that sends no timeout header "
        "(X-Request-Timeout, or the official SDKs' own); default: none, so the maximum applies")
    max_timeout: Annotated[float | None, Flag(t.seconds_or_none, "SECONDS")] = Field(
        _D.max_timeout_s, description="every request's time budget is capped here (none: no cap)")
    deadline_admission: Bool = Field(
        _E.deadline_admission, description="refuse at once a request that cannot meet its deadline at the "
        "measured speed (--no-deadline-admission: admit whatever the forecast says; it still ends at its deadline)")


class ConnectionSettings(Group):
    TITLE = "connections, below the app (docs/connections.md)"
    max_header_bytes: PosInt = Field(
        _C.max_header_bytes, description="request line plus headers, in bytes; over it: 431")
    max_headers: PosInt = Field(_C.max_headers, description="header fields per request; over it: 431")
    header_timeout: Seconds = Field(
        _C.header_timeout_s, description="seconds from a request's first byte to the end of its headers; past it: 408")
    body_timeout: Seconds = Field(
        _C.body_timeout_s, description="seconds a request body may fall silent; past it: 408 and close")
    keepalive_timeout: Seconds = Field(
        _C.keepalive_s, description="seconds a connection may sit with no request in progress (new or kept alive)")
    max_connections: OptPosInt = Field(
        _C.max_connections, description="open connections served fully (default 4096, fewer if file descriptors "
        "are short)")
    health_connections: NonNegInt = Field(
        _C.health_connections, description="connections past --max-connections accepted for /healthz and /readyz only")


class StoreSettings(Group):
    TITLE = "the store: keys, usage, jobs (docs/keys.md)"
    database_url: SecretUrl = Field(
        _S.database_url, description="SQLAlchemy URL of the store, e.g. postgresql+psycopg://user@host/db or "
        "sqlite:///FILE (default: the SQLite file under --data-dir); a secret: also SLUICEGATE_DATABASE_URL_FILE")
    data_dir: Annotated[Path, Flag(Path, "DIR")] = Field(
        _S.data_dir, description="directory of the default SQLite store, resolved once against the working "
        "directory (created on demand; default ./.sluicegate)")
    insecure_no_auth: Bool = Field(
        False, description="serve on a non-loopback address while the store holds no API key (anyone who reaches "
        "the port may use everything); auth still turns on once a key exists")


class RateLimitSettings(Group):
    TITLE = "rate limits and idempotency (docs/ratelimits.md, docs/idempotency.md)"
    redis_url: SecretUrl = Field(
        _R.redis_url, description="rate-limit buckets in Redis, shared by every replica (default: in this "
        "process); a secret: also SLUICEGATE_REDIS_URL_FILE")
    rate_limit_fail_open: Bool = Field(
        _R.fail_open, description="while Redis is unreachable, admit requests unmetered instead of refusing them")
    default_tpm: OptPosInt = Field(
        _R.default_tpm, description="tokens per minute for API keys created without --tpm (default: unlimited)")
    default_burst: OptPosInt = Field(
        _R.default_burst, description="bucket capacity for API keys created without --burst (default: one minute "
        "of tokens)")
    default_rpm: OptPosInt = Field(
        _R.default_rpm, description="requests per minute for API keys created without --rpm, beside their tokens "
        "(default: requests are not counted)")
    default_max_concurrent: OptPosInt = Field(
        _R.default_max_concurrent, description="requests in flight at once for API keys created without "
        "--max-concurrent (default: no limit)")
    idempotency_ttl_hours: Hours = Field(
        IdempotencyConfig().ttl_hours, description="how long the answer to a request with an Idempotency-Key is "
        "kept and replayed")


class JobSettings(Group):
    TITLE = "batch jobs, per API key (docs/jobs.md)"
    batch_max_items: PosInt = Field(_J.max_items_per_job, description="requests one batch job may hold")
    batch_max_file_bytes: PosInt = Field(
        _J.max_file_bytes, description="one uploaded batch file or JSONL body, in bytes")
    batch_max_stored_bytes: PosInt = Field(
        _J.max_stored_bytes, description="bytes of files one API key may keep stored (uploads and job outputs)")
    batch_max_concurrent_jobs: PosInt = Field(
        _J.max_concurrent_jobs, description="unfinished batch jobs one API key may have")
    batch_max_enqueued_tokens: PosInt = Field(
        _J.max_enqueued_tokens, description="estimated tokens of one API key's unfinished batch jobs")
    batch_worker_slots: OptPosInt = Field(
        _J.worker_slots, description="batch items this process runs at once (default: a quarter of --slots)")
    batch_lease_seconds: Seconds = Field(
        _J.lease_s, description="a batch item's lease: a dead replica's items are taken over after it")
    batch_poll_seconds: Seconds = Field(
        _J.poll_s, description="how often a batch worker looks for items it was not told of; idle, it backs off to "
        "8x (on Postgres, other replicas' new jobs are announced at once)")
    batch_validating_timeout: Seconds = Field(
        _J.validating_timeout_s, description="a batch job still validating its input after this fails "
        "(validation_timeout): a process that died reading it holds no slot of the key's limits")
    batch_file_ttl_hours: Annotated[float | None, Flag(t.positive_hours, "HOURS")] = Field(
        _J.file_ttl_hours, description="uploaded batch files expire after this (default: kept until deleted)")
    batch_output_ttl_hours: Hours = Field(
        _J.output_ttl_hours, description="a batch job's output and error files expire after this")


class WebhookSettings(Group):
    TITLE = "webhooks (docs/webhooks.md)"
    webhook_allow_network: Annotated[list[str], NoDecode, Flag(t.network, "CIDR", repeat=True)] = Field(
        list(_W.allow_networks), description="let webhook URLs reach this private, loopback or link-local address "
        "or network (repeatable; default: public addresses only)")
    webhook_max_attempts: PosInt = Field(
        _W.max_attempts, description="attempts per webhook delivery before it is marked failed")
    webhook_backoff_seconds: Seconds = Field(
        _W.backoff_base_s, description="the first webhook retry's delay; each later one doubles (with jitter)")
    webhook_timeout_seconds: Seconds = Field(
        _W.timeout_s, description="one webhook attempt's limit as a whole: connect, send and the receiver's answer")
    webhook_backoff_max_seconds: Seconds = Field(_W.backoff_max_s, description="no webhook retry waits longer")
    webhook_poll_seconds: Seconds = Field(
        _W.poll_s, description="how often each replica looks for due webhook deliveries it was not told of; idle, "
        "it backs off to 8x")
    webhook_max_in_flight: PosInt = Field(
        _W.max_in_flight, description="webhook deliveries sent at once by this process")
    webhook_max_per_endpoint: PosInt = Field(
        _W.max_per_endpoint, description="webhook deliveries sent at once to one endpoint by this process")
    webhook_max_endpoints: PosInt = Field(
        _W.max_endpoints_per_key, description="webhook endpoints one API key may register")


class UpstreamSettings(Group):
    TITLE = "upstream engines (docs/upstream.md, docs/timeouts.md)"
    upstream: Annotated[list[str], NoDecode, Flag(t.text, "[NAME=]URL", repeat=True)] = Field(
        [], description="an OpenAI-compatible engine's base URL, /v1 included; NAME routes requests naming that "
        "model to it (default: the --name served, else the first model the URL lists); repeat: several URLs for "
        "one NAME are balanced by outstanding requests")
    upstream_key: Secret = Field(
        None, description="API key sent to the upstreams as Bearer; a secret: also SLUICEGATE_UPSTREAM_KEY_FILE")
    local_model: Bool = Field(
        True, description="also serve the local GGUF (--no-local-model: only the upstreams; --model then names the "
        "GGUF whose tokenizer they use)")
    upstream_tokenizer: Annotated[list[str], NoDecode, Flag(t.text, "NAME=GGUF", repeat=True)] = Field(
        [], description="NAME=GGUF: the model's own tokenizer, read from a GGUF (vocab only; default: --model's)")
    upstream_version: Annotated[list[str], NoDecode, Flag(t.text, "NAME=VERSION", repeat=True)] = Field(
        [], description=f"NAME=VERSION: an upstream model's served version (default: {UpstreamModel('x').version})")
    upstream_digest: Annotated[list[str], NoDecode, Flag(t.text, "NAME=sha256:HEX", repeat=True)] = Field(
        [], description="NAME=sha256:HEX: an upstream model's weights' digest (default: reported as unknown)")
    upstream_connect_timeout: Seconds = Field(_U.connect_timeout_s, description="connect to an upstream")
    upstream_attempt_timeout: Seconds = Field(_U.attempt_timeout_s, description="one attempt's time to its first token")
    upstream_read_timeout: Seconds = Field(
        _U.read_timeout_s, description="longest silence between two chunks after the first token")
    upstream_retries: NonNegInt = Field(
        _U.retries, description="retries before the first token (connect errors, 502/503/504)")
    upstream_backoff: Annotated[float, Flag(t.nonnegative_seconds, "SECONDS")] = Field(
        _U.backoff_s, description="wait before a retry, jittered over [S/2, S]")
    upstream_breaker_failures: PosInt = Field(
        _U.breaker_failures, description="consecutive failures that open an upstream's circuit")
    upstream_breaker_open: Seconds = Field(
        _U.breaker_open_s, description="how long an open circuit refuses with 503 before one trial request")


GROUPS: tuple[type[Group], ...] = (ModelSettings, HttpSettings, LimitSettings, ConnectionSettings, StoreSettings,
                                   RateLimitSettings, JobSettings, WebhookSettings, UpstreamSettings)
