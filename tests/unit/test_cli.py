"""`sluicegate serve` flags: every LimitsConfig field has one, and it reaches the configuration."""

from __future__ import annotations

import argparse
import dataclasses

import pytest

from sluicegate import cli
from sluicegate.config import DeadlineConfig, IdempotencyConfig, LimitsConfig, WebhookConfig


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    cli._serve_parser(parser.add_subparsers(dest="command"))
    return parser.parse_args(["serve", *argv])


def test_defaults_are_the_config_defaults() -> None:
    assert cli.limits_from_args(parse()) == LimitsConfig()


def test_every_limit_has_a_flag() -> None:
    args = parse("--max-body-bytes", "2048", "--max-prompt-tokens", "64", "--max-new-tokens", "32",
                 "--estimate-new-tokens", "16", "--drain-seconds", "2.5")
    assert cli.limits_from_args(args) == LimitsConfig(
        max_body_bytes=2048, max_prompt_tokens=64, max_new_tokens=32, estimate_new_tokens=16, drain_s=2.5)
    assert {f.name for f in dataclasses.fields(LimitsConfig)} == {
        "max_body_bytes", "max_prompt_tokens", "max_new_tokens", "estimate_new_tokens", "drain_s"}


def test_the_idempotency_ttl_flag() -> None:
    assert parse().idempotency_ttl_hours == IdempotencyConfig().ttl_hours == 24.0
    assert parse("--idempotency-ttl-hours", "0.5").idempotency_ttl_hours == 0.5
    for bad in ("0", "-1", "inf", "nan", "soon"):
        with pytest.raises(SystemExit):
            parse("--idempotency-ttl-hours", bad)


def test_every_batch_field_has_a_flag() -> None:
    from sluicegate import cli_jobs
    from sluicegate.config import JobsConfig

    assert cli_jobs.config_from_args(parse()) == JobsConfig()
    args = parse("--batch-max-items", "5", "--batch-max-file-bytes", "1000", "--batch-max-concurrent-jobs", "2",
                 "--batch-max-enqueued-tokens", "900", "--batch-worker-slots", "3", "--batch-lease-seconds", "7",
                 "--batch-poll-seconds", "0.2", "--batch-file-ttl-hours", "1", "--batch-output-ttl-hours", "2")
    got = cli_jobs.config_from_args(args)
    assert got == JobsConfig(max_items_per_job=5, max_file_bytes=1000, max_concurrent_jobs=2,
                             max_enqueued_tokens=900, worker_slots=3, lease_s=7.0, poll_s=0.2, file_ttl_hours=1.0,
                             output_ttl_hours=2.0)
    assert all(getattr(got, f.name) != f.default for f in dataclasses.fields(JobsConfig))  # each flag reaches it


def test_every_webhook_setting_has_a_flag() -> None:
    assert cli.webhooks_from_args(parse()) == WebhookConfig()
    args = parse("--webhook-allow-network", "127.0.0.1", "--webhook-allow-network", "10.0.0.0/8",
                 "--webhook-max-attempts", "3", "--webhook-backoff-seconds", "0.5", "--webhook-backoff-max-seconds",
                 "9", "--webhook-timeout-seconds", "2", "--webhook-poll-seconds", "0.1", "--webhook-max-in-flight",
                 "4", "--webhook-max-endpoints", "5")
    assert cli.webhooks_from_args(args) == WebhookConfig(
        allow_networks=("127.0.0.1", "10.0.0.0/8"), max_attempts=3, backoff_base_s=0.5, backoff_max_s=9.0,
        timeout_s=2.0, poll_s=0.1, max_in_flight=4, max_endpoints_per_key=5)
    with pytest.raises(SystemExit, match="not an address"):
        cli.webhooks_from_args(parse("--webhook-allow-network", "10.0.0.0/99"))
def test_the_time_budget_flags() -> None:
    assert cli.deadlines_from_args(parse()) == (DeadlineConfig(), True)
    args = parse("--default-timeout", "30", "--max-timeout", "120", "--no-deadline-admission")
    assert cli.deadlines_from_args(args) == (DeadlineConfig(default_timeout_s=30.0, max_timeout_s=120.0), False)
    assert cli.deadlines_from_args(parse("--max-timeout", "none"))[0].max_timeout_s is None
    assert {f.name for f in dataclasses.fields(DeadlineConfig)} == {"default_timeout_s", "max_timeout_s"}
    for bad in ("0", "-1", "inf", "nan", "soon"):
        with pytest.raises(SystemExit):
            parse("--max-timeout", bad)


def test_the_speculative_decoding_flags() -> None:
    from sluicegate.engine import SchedulerConfig

    assert cli.engine_from_args(parse(), True) == SchedulerConfig()  # adaptive by default
    assert cli.engine_from_args(parse("--speculative-ngram", "auto"), True) == SchedulerConfig()
    assert SchedulerConfig().speculative_auto > 0 and SchedulerConfig().speculative_ngram == 0
    off = cli.engine_from_args(parse("--speculative-ngram", "0"), True)
    assert (off.speculative_ngram, off.speculative_auto) == (0, 0)
    cfg = cli.engine_from_args(parse("--speculative-ngram", "5", "--prompt-lookup-max", "4",
                                     "--prompt-lookup-min", "1"), False)
    assert cfg == SchedulerConfig(deadline_admission=False, speculative_ngram=5, speculative_auto=0,
                                  prompt_lookup_max=4, prompt_lookup_min=1)
    for flag, bad in (("--speculative-ngram", "-1"), ("--prompt-lookup-max", "0"), ("--speculative-ngram", "x")):
        with pytest.raises(SystemExit):
            parse(flag, bad)
    with pytest.raises(SystemExit, match="prompt-lookup-min"):
        cli.engine_from_args(parse("--prompt-lookup-max", "2", "--prompt-lookup-min", "3"), True)
