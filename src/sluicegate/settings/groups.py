"""The settings of `serve`, one group per concern, each field named after its long flag.

`--max-new-tokens` is `max_new_tokens` here, `max_new_tokens = 512` in the TOML file and
`SLUICEGATE_MAX_NEW_TOKENS` in the environment. The default of each field is the default of the frozen
configuration it becomes (settings/convert.py), read from one `Config()`, so the two cannot drift apart. Each
field is one line, name, type and default, and its docstring (pydantic's `description`) is the flag's `--help`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, ClassVar

from pydantic import BaseModel, ConfigDict, Field
from pydantic_settings import NoDecode

from sluicegate.config import Config, UpstreamModel
from sluicegate.errorcatalog import DEFAULT_DOCS_URL
from sluicegate.settings import types as t
from sluicegate.settings.flag import Flag

_DEFAULT = Config()
_M, _E, _L, _D, _C = _DEFAULT.model, _DEFAULT.engine, _DEFAULT.limits, _DEFAULT.deadlines, _DEFAULT.connections
_S, _R, _J, _W, _U = _DEFAULT.store, _DEFAULT.ratelimit, _DEFAULT.jobs, _DEFAULT.webhooks, _DEFAULT.upstream
_A = _DEFAULT.auth

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
    """A concern's settings; each field's docstring is its description, one paragraph however it is wrapped."""

    model_config = ConfigDict(use_attribute_docstrings=True)
    TITLE: ClassVar[str] = ""


class ModelSettings(Group):
    TITLE = "the model and the engine (docs/engine.md)"
    model: Annotated[list[str], NoDecode, Flag(t.model_spec, "[NAME=]GGUF", repeat=True)] = []
    """GGUF file (default: SmolLM2-135M-Instruct Q4_1); repeat with NAME=GGUF to serve several models, the request's
    `model` picking one (the first is the default; docs/models.md)"""
    name: OptText = None
    """served model name"""
    model_version: OptText = None
    """served model version"""
    ctx: PosInt = _M.n_ctx
    """context window per request, in tokens"""
    slots: PosInt = _M.n_slots
    """sequences decoded together"""
    threads: OptPosInt = None
    """most CPU threads for compute (default: the usable cores: affinity and cgroup quota)"""
    adaptive_threads: Bool = _M.adaptive_threads
    """use fewer threads while other processes hold cores (default: on)"""
    flash_attn: Bool = _M.flash_attn
    """llama.cpp flash attention, every call kept on its one-row path: outputs never depend on batching, and a
    conversation's earlier replies are reused from the cache (default: on; --no-flash-attn: the plain attention
    kernels)"""
    tiled_prefill: Bool = _M.tiled_prefill
    """prompts on flash attention's tiled kernel (K and V cache in f16), generated tokens on its one-row path: long
    prompts prefill as fast as llama-server's, outputs still never depend on batching, but a conversation's earlier
    replies are computed again as prompt, and a lone sequence's decode step past 192 positions carries a junk row
    (default: off; docs/engine.md, "Tiled prefill")"""
    speculative_ngram: Annotated[str | int, Flag(t.speculative, "auto|K")] = Field(
        "auto", description="speculative decoding for greedy requests, prompt-lookup drafts verified in one step. "
        f"auto (the default): only where verification is exact (flash attention), at most {_E.speculative_auto} "
        "drafts and only as many as the measured cost of a row says pay; K: up to K drafts whenever a match is "
        "found; 0: off")
    prompt_lookup_max: PosInt = _E.prompt_lookup_max
    """speculative decoding: longest n-gram matched to find drafts"""
    prompt_lookup_min: PosInt = _E.prompt_lookup_min
    """speculative decoding: shortest n-gram matched"""
    chat_template_file: Annotated[Path | None, Flag(Path, "JINJA")] = None
    """the model's chat template, a Jinja file (as llama-server's and vLLM's flag): replaces the one in the GGUF, or
    gives one to a model that ships none (docs/models.md)"""
    reasoning_format: Annotated[str, Flag(t.reasoning_format, "|".join(t.REASONING_FORMATS))] = _M.reasoning_format
    """a thinking model's reasoning: auto and deepseek return it apart (`reasoning_content`, reasoning items,
    thinking blocks); none leaves it in the answer's text (default: auto)"""
    kv_cache_bytes: Annotated[int | None, Flag(t.nonnegative_int, "BYTES")] = _E.kv_cache_bytes
    """host memory for evicted slots' KV, restored when their conversation returns instead of prefilled again (default:
    an eighth of the machine's memory; 0: off; docs/engine.md, KV tier)"""
    models_memory_bytes: OptPosInt = None
    """the local models' memory budget (weights files and KV caches): the default model loads at start, another on its
    first request, and the least recently used idle ones are unloaded to make room (default: none, every model loads
    at start and stays; docs/models.md)"""
    model_option: Annotated[list[str], NoDecode, Flag(t.model_option, "NAME:KEY=VALUE", repeat=True)] = []
    """one local model's own setting, over the server-wide one: ctx, slots, threads, chat_template_file, keep_alive,
    version, kv_cache_bytes (repeat it; in the TOML file a [models.NAME] table: `[models.gemma]` `path = "g.gguf"`
    `ctx = 1024`; docs/models.md)"""
    keep_alive: Annotated[list[str], NoDecode, Flag(t.keep_alive, "[NAME=]DURATION", repeat=True)] = []
    """how long an idle local model stays loaded (Ollama's keep_alive: 300, 5m, 1h; 0: unloaded once idle; -1: always);
    NAME=DURATION for one model, a bare DURATION for every model (default: always; docs/models.md)"""


class HttpSettings(Group):
    TITLE = "listening, browsers and logs"
    host: Text = "127.0.0.1"
    """listen address (0.0.0.0: every interface)"""
    port: Annotated[int, Flag(t.port, "PORT")] = 8000
    """listen port"""
    allowed_hosts: Annotated[list[str] | None, NoDecode, Flag(t.host_pattern, "HOST[,HOST...]", repeat=True)] = None
    """Host header names served, comma-separated or repeated (`*.example.com`: its subdomains; `*`: any). Default: on
    a loopback --host only localhost, 127.0.0.1 and [::1] (DNS rebinding protection); on 0.0.0.0 or another address,
    any"""
    cors_origin: Annotated[list[str], NoDecode, Flag(t.cors_origin, "ORIGIN", repeat=True)] = []
    """a browser origin (https://app.example.com) whose pages may call this server, repeatable; `*`: any origin
    (default: none, so browsers refuse other origins' pages)"""
    error_docs_url: Annotated[str, Flag(t.docs_url, "URL")] = DEFAULT_DOCS_URL
    """where the error catalog is published: every error's docs_url is this and the anchor of its type or code; an
    http(s) URL, or a path on this server (the default is the page where this server serves the catalog itself)"""
    log_level: Annotated[str, Flag(t.log_level, "|".join(t.LOG_LEVELS))] = "info"
    """the least severe log line written"""
    log_format: Annotated[str, Flag(t.log_format, "|".join(t.LOG_FORMATS))] = "text"
    """text: a line for people; json: one JSON object a line (the access log line carries the request id, key id, route,
    status, tokens and stage times)"""


class LimitSettings(Group):
    TITLE = "limits every surface shares (docs/serving.md, docs/timeouts.md)"
    max_body_bytes: PosInt = _L.max_body_bytes
    """request body limit, in bytes"""
    max_prompt_tokens: OptPosInt = _L.max_prompt_tokens
    """prompt tokens one request may send (default: the window minus one)"""
    max_new_tokens: PosInt = _L.max_new_tokens
    """new tokens one request may ask for (the window bounds it too)"""
    estimate_new_tokens: PosInt = _L.estimate_new_tokens
    """new tokens the cost estimate assumes for a request that sets no limit"""
    drain_seconds: Annotated[float, Flag(t.nonnegative_seconds, "SECONDS")] = _L.drain_s
    """on SIGTERM, how long in-flight requests may finish before they are cut"""
    default_timeout: Annotated[float | None, Flag(t.seconds_or_none, "SECONDS")] = _D.default_timeout_s
    """time budget of a request that sends no timeout header (X-Request-Timeout, or the official SDKs' own); default:
    none, so the maximum applies"""
    max_timeout: Annotated[float | None, Flag(t.seconds_or_none, "SECONDS")] = _D.max_timeout_s
    """every request's time budget is capped here (none: no cap)"""
    deadline_admission: Bool = _E.deadline_admission
    """refuse at once a request that cannot meet its deadline at the measured speed (--no-deadline-admission: admit
    whatever the forecast says; it still ends at its deadline)"""


class ConnectionSettings(Group):
    TITLE = "connections, below the app (docs/connections.md)"
    max_header_bytes: PosInt = _C.max_header_bytes
    """request line plus headers, in bytes; over it: 431"""
    max_headers: PosInt = _C.max_headers
    """header fields per request; over it: 431"""
    header_timeout: Seconds = _C.header_timeout_s
    """seconds from a request's first byte to the end of its headers; past it: 408"""
    body_timeout: Seconds = _C.body_timeout_s
    """seconds a request body may fall silent; past it: 408 and close"""
    keepalive_timeout: Seconds = _C.keepalive_s
    """seconds a connection may sit with no request in progress (new or kept alive)"""
    max_connections: OptPosInt = _C.max_connections
    """open connections served fully (default 4096, fewer if file descriptors are short)"""
    health_connections: NonNegInt = _C.health_connections
    """connections past --max-connections accepted for /healthz and /readyz only"""


class StoreSettings(Group):
    TITLE = "the store: keys, usage, jobs (docs/keys.md)"
    database_url: SecretUrl = _S.database_url
    """SQLAlchemy URL of the store, e.g. postgresql+psycopg://user@host/db or sqlite:///FILE (default: the SQLite file
    under --data-dir); a secret: also SLUICEGATE_DATABASE_URL_FILE"""
    data_dir: Annotated[Path, Flag(Path, "DIR")] = _S.data_dir
    """directory of the default SQLite store, resolved once against the working directory (created on demand; default
    ./.sluicegate)"""
    insecure_no_auth: Bool = False
    """serve on a non-loopback address while the store holds no API key (anyone who reaches the port may use
    everything); auth still turns on once a key exists"""
    key_stale_seconds: Annotated[float, Flag(t.nonnegative_seconds, "SECONDS")] = _A.key_stale_s
    """while the store cannot be read, keys this process verified within this long are still accepted (a
    revocation made meanwhile is seen once the store answers); 0: refuse every key while it is down"""


class RateLimitSettings(Group):
    TITLE = "rate limits and idempotency (docs/ratelimits.md, docs/idempotency.md)"
    redis_url: SecretUrl = _R.redis_url
    """rate-limit buckets in Redis, shared by every replica (default: in this process); a secret: also
    SLUICEGATE_REDIS_URL_FILE"""
    rate_limit_fail_open: Bool = _R.fail_open
    """while Redis is unreachable, admit requests unmetered instead of refusing them"""
    default_tpm: OptPosInt = _R.default_tpm
    """tokens per minute for API keys created without --tpm (default: unlimited)"""
    default_burst: OptPosInt = _R.default_burst
    """bucket capacity for API keys created without --burst (default: one minute of tokens)"""
    default_rpm: OptPosInt = _R.default_rpm
    """requests per minute for API keys created without --rpm, beside their tokens (default: requests are not
    counted)"""
    default_max_concurrent: OptPosInt = _R.default_max_concurrent
    """requests in flight at once for API keys created without --max-concurrent (default: no limit)"""
    idempotency_ttl_hours: Hours = _DEFAULT.idempotency.ttl_hours
    """how long the answer to a request with an Idempotency-Key is kept and replayed"""


class JobSettings(Group):
    TITLE = "batch jobs, per API key (docs/jobs.md)"
    batch_max_items: PosInt = _J.max_items_per_job
    """requests one batch job may hold"""
    batch_max_file_bytes: PosInt = _J.max_file_bytes
    """one uploaded batch file or JSONL body, in bytes"""
    batch_max_stored_bytes: PosInt = _J.max_stored_bytes
    """bytes of files one API key may keep stored (uploads and job outputs)"""
    batch_max_concurrent_jobs: PosInt = _J.max_concurrent_jobs
    """unfinished batch jobs one API key may have"""
    batch_max_enqueued_tokens: PosInt = _J.max_enqueued_tokens
    """estimated tokens of one API key's unfinished batch jobs"""
    batch_worker_slots: OptPosInt = _J.worker_slots
    """batch items this process runs at once (default: a quarter of --slots)"""
    batch_lease_seconds: Seconds = _J.lease_s
    """a batch item's lease: a dead replica's items are taken over after it"""
    batch_poll_seconds: Seconds = _J.poll_s
    """how often a batch worker looks for items it was not told of; idle, it backs off to 8x (on Postgres, other
    replicas' new jobs are announced at once)"""
    batch_validating_timeout: Seconds = _J.validating_timeout_s
    """a batch job still validating its input after this fails (validation_timeout): a process that died reading it
    holds no slot of the key's limits"""
    batch_file_ttl_hours: Annotated[float | None, Flag(t.positive_hours, "HOURS")] = _J.file_ttl_hours
    """uploaded batch files expire after this (default: kept until deleted)"""
    batch_output_ttl_hours: Hours = _J.output_ttl_hours
    """a batch job's output and error files expire after this"""


class WebhookSettings(Group):
    TITLE = "webhooks (docs/webhooks.md)"
    webhook_allow_network: Annotated[list[str], NoDecode, Flag(t.network, "CIDR", repeat=True)] = [*_W.allow_networks]
    """let webhook URLs reach this private, loopback or link-local address or network (repeatable; default: public
    addresses only)"""
    webhook_max_attempts: PosInt = _W.max_attempts
    """attempts per webhook delivery before it is marked failed"""
    webhook_backoff_seconds: Seconds = _W.backoff_base_s
    """the first webhook retry's delay; each later one doubles (with jitter)"""
    webhook_timeout_seconds: Seconds = _W.timeout_s
    """one webhook attempt's limit as a whole: connect, send and the receiver's answer"""
    webhook_backoff_max_seconds: Seconds = _W.backoff_max_s
    """no webhook retry waits longer"""
    webhook_poll_seconds: Seconds = _W.poll_s
    """how often each replica looks for due webhook deliveries it was not told of; idle, it backs off to 8x"""
    webhook_max_in_flight: PosInt = _W.max_in_flight
    """webhook deliveries sent at once by this process"""
    webhook_max_per_endpoint: PosInt = _W.max_per_endpoint
    """webhook deliveries sent at once to one endpoint by this process"""
    webhook_max_endpoints: PosInt = _W.max_endpoints_per_key
    """webhook endpoints one API key may register"""


class UpstreamSettings(Group):
    TITLE = "upstream engines (docs/upstream.md, docs/timeouts.md)"
    upstream: Annotated[list[str], NoDecode, Flag(t.text, "[NAME=]URL", repeat=True)] = []
    """an OpenAI-compatible engine's base URL, /v1 included; NAME routes requests naming that model to it (default: the
    --name served, else the first model the URL lists); repeat: several URLs for one NAME are balanced by outstanding
    requests"""
    upstream_key: Secret = None
    """API key sent to the upstreams as Bearer; a secret: also SLUICEGATE_UPSTREAM_KEY_FILE"""
    local_model: Bool = True
    """also serve the local GGUF (--no-local-model: only the upstreams; --model then names the GGUF whose tokenizer they
    use)"""
    upstream_tokenizer: Annotated[list[str], NoDecode, Flag(t.text, "NAME=GGUF", repeat=True)] = []
    """NAME=GGUF: the model's own tokenizer, read from a GGUF (vocab only; default: --model's)"""
    upstream_version: Annotated[list[str], NoDecode, Flag(t.text, "NAME=VERSION", repeat=True)] = Field(
        [], description=f"NAME=VERSION: an upstream model's served version (default: {UpstreamModel('x').version})")
    upstream_digest: Annotated[list[str], NoDecode, Flag(t.text, "NAME=sha256:HEX", repeat=True)] = []
    """NAME=sha256:HEX: an upstream model's weights' digest (default: reported as unknown)"""
    upstream_connect_timeout: Seconds = _U.connect_timeout_s
    """connect to an upstream"""
    upstream_attempt_timeout: Seconds = _U.attempt_timeout_s
    """one attempt's time to its first token"""
    upstream_read_timeout: Seconds = _U.read_timeout_s
    """longest silence between two chunks after the first token"""
    upstream_retries: NonNegInt = _U.retries
    """retries before the first token (connect errors, 502/503/504)"""
    upstream_backoff: Annotated[float, Flag(t.nonnegative_seconds, "SECONDS")] = _U.backoff_s
    """wait before a retry, jittered over [S/2, S]"""
    upstream_breaker_failures: PosInt = _U.breaker_failures
    """consecutive failures that open an upstream's circuit"""
    upstream_breaker_open: Seconds = _U.breaker_open_s
    """how long an open circuit refuses with 503 before one trial request"""


GROUPS: tuple[type[Group], ...] = (ModelSettings, HttpSettings, LimitSettings, ConnectionSettings, StoreSettings,
                                   RateLimitSettings, JobSettings, WebhookSettings, UpstreamSettings)
