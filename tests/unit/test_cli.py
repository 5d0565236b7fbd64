"""`sluicegate serve` flags: every LimitsConfig field has one, and it reaches the configuration."""

from __future__ import annotations

import argparse
import dataclasses

import pytest

from sluicegate import cli
from sluicegate.config import DeadlineConfig, IdempotencyConfig, LimitsConfig


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


def test_the_time_budget_flags() -> None:
    assert cli.deadlines_from_args(parse()) == (DeadlineConfig(), True)
    args = parse("--default-timeout", "30", "--max-timeout", "120", "--no-deadline-admission")
    assert cli.deadlines_from_args(args) == (DeadlineConfig(default_timeout_s=30.0, max_timeout_s=120.0), False)
    assert cli.deadlines_from_args(parse("--max-timeout", "none"))[0].max_timeout_s is None
    assert {f.name for f in dataclasses.fields(DeadlineConfig)} == {"default_timeout_s", "max_timeout_s"}
    for bad in ("0", "-1", "inf", "nan", "soon"):
        with pytest.raises(SystemExit):
            parse("--max-timeout", bad)
