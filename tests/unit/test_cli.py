"""`sluicegate serve` flags: every config field has one, and it reaches the configuration."""

from __future__ import annotations

import argparse
import dataclasses

import pytest

from sluicegate.cli import parser
from sluicegate.cli.serve import load_args
from sluicegate.config import Config, DeadlineConfig, IdempotencyConfig, JobsConfig, LimitsConfig, WebhookConfig
from sluicegate.engine import SchedulerConfig
from sluicegate.errorcatalog import DEFAULT_DOCS_URL
from sluicegate.settings import to_config
from sluicegate.settings.convert import engine_config


def parse(*argv: str) -> argparse.Namespace:
    return parser().parse_args(["serve", *argv])


def config(*argv: str) -> Config:
    return to_config(load_args(parse(*argv)).settings)


def test_defaults_are_the_config_defaults() -> None:
    c = config()
    assert (c.limits, c.jobs, c.webhooks, c.deadlines, c.engine) == (
        LimitsConfig(), JobsConfig(), WebhookConfig(), DeadlineConfig(), SchedulerConfig())
    assert c.idempotency == IdempotencyConfig() and c.cors_origins == () and c.allowed_hosts is None


def test_every_limit_has_a_flag() -> None:
    c = config("--max-body-bytes", "2048", "--max-prompt-tokens", "64", "--max-new-tokens", "32",
               "--estimate-new-tokens", "16", "--drain-seconds", "2.5")
    assert c.limits == LimitsConfig(max_body_bytes=2048, max_prompt_tokens=64, max_new_tokens=32,
                                    estimate_new_tokens=16, drain_s=2.5)
    assert {f.name for f in dataclasses.fields(LimitsConfig)} == {
        "max_body_bytes", "max_prompt_tokens", "max_new_tokens", "estimate_new_tokens", "drain_s"}


def test_the_idempotency_ttl_flag() -> None:
    assert config("--idempotency-ttl-hours", "0.5").idempotency.ttl_hours == 0.5
    for bad in ("0", "-1", "inf", "nan", "soon"):
        with pytest.raises(SystemExit):
            parse("--idempotency-ttl-hours", bad)


def test_every_batch_field_has_a_flag() -> None:
    got = config("--batch-max-items", "5", "--batch-max-file-bytes", "1000", "--batch-max-stored-bytes", "5000",
                 "--batch-max-concurrent-jobs", "2",
                 "--batch-max-enqueued-tokens", "900", "--batch-worker-slots", "3", "--batch-lease-seconds", "7",
                 "--batch-poll-seconds", "0.2", "--batch-file-ttl-hours", "1", "--batch-output-ttl-hours", "2",
                 "--batch-validating-timeout", "30").jobs
    assert got == JobsConfig(max_items_per_job=5, max_file_bytes=1000, max_stored_bytes=5000, max_concurrent_jobs=2,
                             max_enqueued_tokens=900, worker_slots=3, lease_s=7.0, poll_s=0.2, file_ttl_hours=1.0,
                             output_ttl_hours=2.0, validating_timeout_s=30.0)
    assert all(getattr(got, f.name) != f.default for f in dataclasses.fields(JobsConfig))  # each flag reaches it


def test_every_webhook_setting_has_a_flag() -> None:
    got = config("--webhook-allow-network", "127.0.0.1", "--webhook-allow-network", "10.0.0.0/8",
                 "--webhook-max-attempts", "3", "--webhook-backoff-seconds", "0.5", "--webhook-backoff-max-seconds",
                 "9", "--webhook-timeout-seconds", "2", "--webhook-poll-seconds", "0.1", "--webhook-max-in-flight",
                 "4", "--webhook-max-per-endpoint", "3", "--webhook-max-endpoints", "5").webhooks
    assert got == WebhookConfig(
        allow_networks=("127.0.0.1", "10.0.0.0/8"), max_attempts=3, backoff_base_s=0.5, backoff_max_s=9.0,
        timeout_s=2.0, poll_s=0.1, max_in_flight=4, max_per_endpoint=3, max_endpoints_per_key=5)
    with pytest.raises(SystemExit):
        parse("--webhook-allow-network", "10.0.0.0/99")


def test_the_time_budget_flags() -> None:
    c = config("--default-timeout", "30", "--max-timeout", "120", "--no-deadline-admission")
    assert c.deadlines == DeadlineConfig(default_timeout_s=30.0, max_timeout_s=120.0)
    assert not c.engine.deadline_admission
    assert config("--max-timeout", "none").deadlines.max_timeout_s is None
    for bad in ("0", "-1", "inf", "nan", "soon"):
        with pytest.raises(SystemExit):
            parse("--max-timeout", bad)


def test_the_speculative_decoding_flags() -> None:
    assert config("--speculative-ngram", "auto").engine == SchedulerConfig()
    assert SchedulerConfig().speculative_auto > 0 and SchedulerConfig().speculative_ngram == 0
    off = config("--speculative-ngram", "0").engine
    assert (off.speculative_ngram, off.speculative_auto) == (0, 0)
    cfg = config("--speculative-ngram", "5", "--prompt-lookup-max", "4", "--prompt-lookup-min", "1",
                 "--no-deadline-admission").engine
    assert cfg == SchedulerConfig(deadline_admission=False, speculative_ngram=5, speculative_auto=0,
                                  prompt_lookup_max=4, prompt_lookup_min=1)
    for flag, bad in (("--speculative-ngram", "-1"), ("--prompt-lookup-max", "0"), ("--speculative-ngram", "x")):
        with pytest.raises(SystemExit):
            parse(flag, bad)
    with pytest.raises(ValueError, match="prompt-lookup-min"):
        engine_config(load_args(parse("--prompt-lookup-max", "2", "--prompt-lookup-min", "3")).settings)


def test_the_kv_tier_budget_is_a_flag_defaulting_to_a_share_of_memory() -> None:
    assert config().engine.kv_cache_bytes is None  # resolved by the engine: engine/kv_tier.py default_budget
    assert config("--kv-cache-bytes", "0").engine.kv_cache_bytes == 0
    assert config("--kv-cache-bytes", "1048576").engine.kv_cache_bytes == 1 << 20
    with pytest.raises(SystemExit):
        parse("--kv-cache-bytes", "-1")


def test_log_level_takes_only_the_levels_and_the_version_flag(capsys: pytest.CaptureFixture[str]) -> None:
    assert load_args(parse("--log-level", "WARNING")).settings.log_level == "warning"
    with pytest.raises(SystemExit):
        parse("--log-level", "chatty")
    assert "the log level is one of debug, info, warning, error, critical" in capsys.readouterr().err
    with pytest.raises(SystemExit) as info:
        parser().parse_args(["--version"])
    assert info.value.code == 0
    assert capsys.readouterr().out.startswith("sluicegate 0.1.0 (llama-cpp-python ")


def test_cors_origins_are_origins() -> None:
    c = config("--cors-origin", "https://App.example.com", "--cors-origin", "http://127.0.0.1:5173/")
    assert c.cors_origins == ("https://app.example.com", "http://127.0.0.1:5173")
    for bad in ("https://app.example.com/path", "ftp://x", "app.example.com"):
        with pytest.raises(SystemExit):
            parse("--cors-origin", bad)


def test_error_docs_url_is_an_address_to_append_an_anchor_to() -> None:
    assert config().error_docs_url == DEFAULT_DOCS_URL
    assert DEFAULT_DOCS_URL == "/docs/errors"  # the catalog this server serves, relative to the server that answered
    assert config("--error-docs-url", " https://docs.example.com/errors.html ").error_docs_url == (
        "https://docs.example.com/errors.html")
    assert config("--error-docs-url", "/llm/docs/errors").error_docs_url == "/llm/docs/errors"  # behind a prefix
    for bad in ("ftp://docs.example.com/e", "https://docs.example.com/e#top", "docs.example.com/e", "https://",
                "https://docs.example.com/a b", "https://dócs.example.com/e", "https://x.example/" + "e" * 600,
                "//docs.example.com/e", "/\\docs.example.com/e", "/docs/errors#top", "/" + "e" * 600):
        with pytest.raises(SystemExit):
            parse("--error-docs-url", bad)
