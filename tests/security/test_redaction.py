"""Secrets in configuration never reach `config show`, an error message or a log line, whatever characters the
password holds: database URLs as SQLAlchemy reads them, Redis and upstream URLs with their user information
masked, the `_FILE` forms the same, and a refused `--upstream` named without its credentials."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from sluicegate import redaction
from sluicegate.cli import main
from sluicegate.store.db import display_url

# every character a parser might take for a separator, a percent sign, and text beyond ASCII
PASSWORDS = ["Sup3r/S3cret", "Sup3r?S3cret", "Sup3r#S3cret", "Sup3r@S3cret", "Sup3r:S3cret", "Sup3r%S3cret",
             "Sup3r%2FS3cret", "Süp3r✓S3crét", "Sup3r/?#@:%S3cret"]
PIECES = ("Sup3r", "Süp3r", "S3cret", "S3crét")  # no part of a password may show


def _clean(text: str) -> None:
    assert not any(p in text for p in PIECES), text
    assert "Traceback" not in text


@pytest.mark.parametrize("pw", PASSWORDS)
def test_config_show_masks_every_password(pw: str, monkeypatch: pytest.MonkeyPatch,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("SLUICEGATE_DATABASE_URL", f"postgresql+psycopg://app:{pw}@db:5432/sg")
    monkeypatch.setenv("SLUICEGATE_REDIS_URL", f"redis://default:{pw}@cache:6379/0")
    monkeypatch.setenv("SLUICEGATE_UPSTREAM", f"gpu=http://user:{pw}@10.0.0.5:8000/v1")
    monkeypatch.setenv("SLUICEGATE_UPSTREAM_KEY", pw)
    assert main(["config", "show"]) == 0
    out, err = capsys.readouterr()
    _clean(out + err)
    if "?" not in pw and "#" not in pw:  # else no reading tells the host from the password: masked whole
        assert "10.0.0.5:8000/v1" in out and "cache:6379/0" in out  # what is no secret still shows


@pytest.mark.parametrize("pw", PASSWORDS)
def test_the_file_forms_are_masked_alike(pw: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    for name, value in (("DATABASE_URL", f"postgresql+psycopg://app:{pw}@db/sg?sslpassword={pw}"),
                        ("REDIS_URL", f"rediss://:{pw}@cache:6380"), ("UPSTREAM_KEY", pw)):
        (tmp_path / name).write_text(value + "\n", encoding="utf-8")
        monkeypatch.setenv(f"SLUICEGATE_{name}_FILE", str(tmp_path / name))
    assert main(["config", "show"]) == 0
    out, err = capsys.readouterr()
    _clean(out + err)


@pytest.mark.parametrize("pw", PASSWORDS)
def test_a_refused_upstream_is_named_without_its_credentials(pw: str, monkeypatch: pytest.MonkeyPatch,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    for bad in (f"gpu=ftp://user:{pw}@10.0.0.5/v1", f"gpu=http://user:{pw}@10.0.0.5:8000/api"):
        assert main(["config", "show", "--upstream", bad]) == 2
        out, err = capsys.readouterr()
        _clean(out + err)
        assert "--upstream" in err


@pytest.mark.parametrize("pw", PASSWORDS)
def test_every_redaction_hides_the_password(pw: str) -> None:
    db = f"postgresql+psycopg://app:{pw}@db:5432/sg"
    for shown in (redaction.database_url(db), display_url(db), redaction.url(db),
                  redaction.url(f"http://{pw}@host/v1"),  # a token as the user name
                  redaction.urls_in(f"upstream http://user:{pw}@10.0.0.5:8000/v1: not reachable (ConnectError)")):
        _clean(shown)
    shown = redaction.database_url(db)
    assert shown == redaction.MASK or shown.endswith("@db:5432/sg")  # unreadable to SQLAlchemy: masked whole


def test_a_log_line_about_an_upstream_never_holds_its_credentials(caplog: pytest.LogCaptureFixture) -> None:
    from sluicegate.upstream.pool import Endpoint

    ep = Endpoint("http://user:Sup3r/S3cret@10.0.0.5:8000/v1")
    with caplog.at_level(logging.INFO):
        logging.getLogger("sluicegate.upstream").info("upstream %s: retrying", ep.shown)
    _clean(caplog.text)
    assert "10.0.0.5:8000/v1" in caplog.text
