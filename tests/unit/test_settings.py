"""One settings model: flag > SLUICEGATE_* environment > TOML file > default, secrets from files, `config show`."""

from __future__ import annotations

from pathlib import Path

import pytest

from sluicegate.cli import main
from sluicegate.settings import SettingsError, load, redact, render

SECRET = "hunter2-correct-horse"


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    for name in list(os.environ):
        if name.upper().startswith("SLUICEGATE_") and name.upper() != "SLUICEGATE_TEST_POSTGRES":
            monkeypatch.delenv(name)


def toml(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "sluicegate.toml"
    path.write_text(text)
    return path


def test_precedence_is_flag_then_environment_then_file_then_default(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    file = toml(tmp_path, "max_new_tokens = 100\nslots = 3\nctx = 512\n")
    monkeypatch.setenv("SLUICEGATE_MAX_NEW_TOKENS", "200")
    monkeypatch.setenv("SLUICEGATE_SLOTS", "5")
    loaded = load({"max_new_tokens": 300}, file)
    s = loaded.settings
    assert (s.max_new_tokens, s.slots, s.ctx, s.port) == (300, 5, 512, 8000)
    assert loaded.origin["max_new_tokens"] == "--max-new-tokens"
    assert loaded.origin["slots"] == "SLUICEGATE_SLOTS"
    assert loaded.origin["ctx"] == str(file)
    assert loaded.origin["port"] == "default"


def test_the_file_may_be_named_by_the_environment_and_lists_come_comma_separated(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SLUICEGATE_CONFIG", str(toml(tmp_path, 'cors_origin = ["https://a.example"]\n')))
    assert load({}).settings.cors_origin == ["https://a.example"]
    monkeypatch.setenv("SLUICEGATE_CORS_ORIGIN", "https://b.example, https://c.example")
    monkeypatch.setenv("SLUICEGATE_INSECURE_NO_AUTH", "true")
    monkeypatch.setenv("SLUICEGATE_CTX", "")  # empty: as if unset
    s = load({}).settings
    assert s.cors_origin == ["https://b.example", "https://c.example"] and s.insecure_no_auth and s.ctx == 2048


def test_an_unknown_key_in_the_file_is_refused_by_name(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    file = toml(tmp_path, "max_new_token = 5\n")
    with pytest.raises(SettingsError, match=r"unknown setting 'max_new_token' \(did you mean max_new_tokens\?\)"):
        load({}, file)
    assert main(["config", "show", "--config", str(file)]) == 2
    assert "max_new_token" in capsys.readouterr().err
    with pytest.raises(SettingsError, match="is a table"):
        load({}, toml(tmp_path, "[serve]\nctx = 5\n"))
    with pytest.raises(SettingsError, match="not valid TOML"):
        load({}, toml(tmp_path, "ctx = = 5\n"))


def test_a_bad_value_is_refused_naming_where_it_came_from(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(SettingsError, match=r"ctx \(from .*sluicegate.toml\): must be at least 1, not 0"):
        load({}, toml(tmp_path, "ctx = 0\n"))
    monkeypatch.setenv("SLUICEGATE_LOG_LEVEL", "chatty")
    with pytest.raises(SettingsError, match=r"log_level \(from SLUICEGATE_LOG_LEVEL\): the log level is one of"):
        load({})


def test_a_relative_data_dir_in_the_file_is_the_files_and_is_resolved_once(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    conf = tmp_path / "etc"
    conf.mkdir()
    file = conf / "sluicegate.toml"
    file.write_text('data_dir = "state"\n')
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    assert load({}, file).settings.data_dir == conf / "state"
    assert load({}).settings.data_dir == elsewhere / ".sluicegate"  # the default: absolute, from where it started


def test_secrets_come_from_files_and_are_never_printed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    db = tmp_path / "db_url"
    db.write_text(f"postgresql+psycopg://app:{SECRET}@db:5432/sg\n")
    key = tmp_path / "up_key"
    key.write_text(SECRET + "\n")
    monkeypatch.setenv("SLUICEGATE_DATABASE_URL_FILE", str(db))
    monkeypatch.setenv("SLUICEGATE_UPSTREAM_KEY_FILE", str(key))
    monkeypatch.setenv("SLUICEGATE_REDIS_URL", f"redis://:{SECRET}@cache:6379/0?password={SECRET}")
    loaded = load({})
    assert loaded.settings.database_url == f"postgresql+psycopg://app:{SECRET}@db:5432/sg"
    assert loaded.settings.upstream_key == SECRET
    assert loaded.origin["database_url"] == f"SLUICEGATE_DATABASE_URL_FILE ({db})"
    shown = render(loaded)
    assert SECRET not in shown
    assert 'database_url                = "postgresql+psycopg://app:***@db:5432/sg"' in shown
    assert 'redis_url                   = "redis://***@cache:6379/0?***"' in shown
    assert 'upstream_key                = "***"' in shown
    assert main(["config", "show"]) == 0
    out, err = capsys.readouterr()
    assert SECRET not in out + err and "SLUICEGATE_UPSTREAM_KEY_FILE" in out


def test_a_secret_set_twice_or_unreadable_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SLUICEGATE_UPSTREAM_KEY_FILE", str(tmp_path / "missing"))
    with pytest.raises(SettingsError, match="cannot be read"):
        load({})
    monkeypatch.setenv("SLUICEGATE_UPSTREAM_KEY", SECRET)
    with pytest.raises(SettingsError, match="both SLUICEGATE_UPSTREAM_KEY and SLUICEGATE_UPSTREAM_KEY_FILE") as info:
        load({})
    assert SECRET not in str(info.value)


def test_a_variable_that_is_no_setting_is_named_with_the_nearest(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SLUICEGATE_MAX_NEW_TOKEN", "5")
    monkeypatch.setenv("SLUICEGATE_API_KEY", "a client's, not a setting")
    assert load({}).warnings == ("SLUICEGATE_MAX_NEW_TOKEN is not a setting (did you mean max_new_tokens?); it is "
                                 "ignored",)


@pytest.mark.parametrize(("value", "name", "shown"), [
    ("postgresql+psycopg://app:pw@db/sg", "database_url", "postgresql+psycopg://app:***@db/sg"),
    ("postgresql+psycopg://app@db/sg", "database_url", "postgresql+psycopg://app@db/sg"),
    ("postgresql+psycopg://app@db/sg?password=pw", "database_url", "postgresql+psycopg://app@db/sg?password=***"),
    ("redis://[::1]:6379/0", "redis_url", "redis://[::1]:6379/0"),
    ("redis://user:pw@cache:6379/0", "redis_url", "redis://***@cache:6379/0"),
    ("gpu=http://tok@10.0.0.5:8000/v1", "upstream", "gpu=http://***@10.0.0.5:8000/v1"),
    ("sk-abcdef", "upstream_key", "***"),
    ("not a url://x", "redis_url", "***"),
])
def test_redaction(value: str, name: str, shown: str) -> None:
    assert redact(value, name) == shown
