"""`serve --upstream ...`: the flags reach UpstreamConfig, and a ladder that cannot fit is refused at start."""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

import pytest

from sluicegate.cli import main, parser
from sluicegate.cli.serve import load_args
from sluicegate.config import DeadlineConfig, UpstreamConfig, UpstreamModel, UpstreamTarget
from sluicegate.settings.convert import upstream_config
from sluicegate.upstream.pool import Endpoint, pick


def parse(*argv: str) -> argparse.Namespace:
    return parser().parse_args(["serve", *argv])


def upstream_of(args: argparse.Namespace, name: str | None) -> UpstreamConfig:
    """As `serve` builds it: the ladder must fit the --max-timeout in force."""
    return upstream_config(load_args(args).settings, name)


def test_defaults_fit_and_no_upstream_is_the_default() -> None:
    cfg = upstream_of(parse(), "m")
    assert cfg == UpstreamConfig()
    assert cfg.ladder_s() == 2 * 20.0 + 0.2 <= DeadlineConfig().max_timeout_s


def test_every_ladder_knob_has_a_flag(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SLUICEGATE_UPSTREAM_KEY", "from-env")
    args = parse("--upstream", "http://a:1/v1", "--upstream", "big=http://b:2/v1/", "--no-local-model",
                 "--upstream-version", "big=v3", "--upstream-digest", "big=sha256:" + "ab" * 32,
                 "--upstream-tokenizer", "big=/m/big.gguf", "--upstream-connect-timeout", "1",
                 "--upstream-attempt-timeout", "5", "--upstream-read-timeout", "7", "--upstream-retries", "2",
                 "--upstream-backoff", "0.5", "--upstream-breaker-failures", "3",
                 "--upstream-breaker-open", "4")
    cfg = upstream_of(args, "small")
    assert cfg.targets == (UpstreamTarget("small", "http://a:1/v1"), UpstreamTarget("big", "http://b:2/v1"))
    assert UpstreamModel("big", "v3", "sha256:" + "ab" * 32, Path("/m/big.gguf")) in cfg.models
    assert cfg.api_key == "from-env" and not cfg.local_model
    assert (cfg.connect_timeout_s, cfg.attempt_timeout_s, cfg.read_timeout_s, cfg.retries, cfg.backoff_s,
            cfg.breaker_failures, cfg.breaker_open_s) == (1, 5, 7, 2, 0.5, 3, 4)
    knobs = {f.name for f in dataclasses.fields(UpstreamConfig)} - {"targets", "models", "api_key", "local_model"}
    # each has a flag, set above, but the pool size
    assert knobs == {"connect_timeout_s", "attempt_timeout_s", "read_timeout_s", "retries", "backoff_s",
                     "breaker_failures", "breaker_open_s", "max_connections"}
    assert upstream_of(parse("--upstream", "http://a/v1", "--upstream-key", "k"),
                                           None).api_key == "k"


@pytest.mark.parametrize(("argv", "says"), [
    (("--upstream-attempt-timeout", "100", "--upstream-retries", "3", "--upstream", "http://a/v1", "--max-timeout",
      "300"), "4 attempts x 100 s + 3 x 0.2 s backoff = 400.6 s, more than --max-timeout 300 s"),
    (("--upstream", "http://a:1"), "/v1 included"),
    (("--upstream", "ftp://a/v1"), "http(s) URL"),
    (("--no-local-model",), "needs at least one --upstream"),
    (("--upstream", "http://a/v1", "--upstream-version", "other=v1"), "'other' is not the name of any"),
    (("--upstream", "m=http://a/v1", "--upstream-digest", "m=md5:x"), "64 lowercase hex"),
    (("--upstream", "http://a/v1", "--upstream-connect-timeout", "30"), "exceeds --upstream-attempt-timeout"),
])
def test_a_configuration_that_cannot_work_is_refused_with_the_numbers(argv: tuple[str, ...], says: str) -> None:
    with pytest.raises(ValueError) as info:
        upstream_of(parse(*argv), "m")
    assert says in str(info.value)


def test_serve_exits_2_with_the_message(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["serve", "--upstream", "http://a/v1", "--upstream-retries", "100"]) == 2
    assert "does not fit the budget" in capsys.readouterr().err


def test_the_breaker_opens_refuses_then_lets_one_trial_through() -> None:
    a, b = Endpoint("http://a/v1", failures_to_open=2, open_s=0.0), Endpoint("http://b/v1")
    a.outstanding = 0
    b.outstanding = 1
    assert pick([a, b]) is a  # fewest outstanding
    for _ in range(2):
        a.acquire(0.0)
        a.release(False)
    assert a.open_until > 0 and a.root == "http://a"
    assert pick([a, b], exclude=b) is a  # open_s=0: half-open already, one trial
    a.acquire(a.open_until)
    assert a.trial and not a.available(a.open_until) and pick([a]) is None
    a.release(True)
    assert a.available(0.0) and a.failures == 0


def test_a_name_an_upstream_serves_is_not_also_served_locally() -> None:
    assert not upstream_of(parse("--upstream", "http://a/v1"), "m").local_model
    assert not upstream_of(parse("--upstream", "m=http://a/v1"), "m").local_model
    assert upstream_of(parse("--upstream", "big=http://a/v1"), "m").local_model
