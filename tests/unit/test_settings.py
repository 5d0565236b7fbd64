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


def test_keep_alive_and_the_models_budget_become_the_model_config(tmp_path: Path) -> None:
    from sluicegate.settings import to_config

    file = toml(tmp_path, 'keep_alive = ["5m", "gemma=0", "smol=-1"]\nmodels_memory_bytes = 1500000000\n')
    m = to_config(load({}, file).settings).model
    assert m.memory_bytes == 1_500_000_000
    assert (m.keep_alive_s("gemma"), m.keep_alive_s("smol"), m.keep_alive_s("other")) == (0.0, None, 300.0)
    assert to_config(load({"keep_alive": ["90s", "1h"]}).settings).model.keep_alive_s("x") == 3600.0  # the last
    assert to_config(load({}).settings).model.keep_alive_s("x") is None  # default: it stays
    for bad in ("soon", "5 minutes", "gemma=", "=5m", "x y=5m", "nan", "inf"):
        with pytest.raises(SettingsError, match="keep_alive"):
            load({}, toml(tmp_path, f'keep_alive = ["{bad}"]\n'))


def test_a_directory_of_ggufs_serves_each_by_its_name(tmp_path: Path) -> None:
    from sluicegate.settings import to_config

    models = tmp_path / "models"
    models.mkdir()
    for name in ("B_Model.Q4.gguf", "a-model.gguf", "notes.txt"):
        (models / name).write_bytes(b"GGUF")
    m = to_config(load({"model": [str(models)]}).settings).model
    assert m.path == models / "a-model.gguf"  # the first in name order is the default
    assert m.more == (("b_model.q4", models / "B_Model.Q4.gguf"),)
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match=r"holds no \.gguf"):
        to_config(load({"model": [str(tmp_path / "empty")]}).settings)


def test_models_tables_in_the_file_are_each_models_own_settings(tmp_path: Path) -> None:
    from sluicegate.config import ModelOptions
    from sluicegate.settings import to_config

    file = toml(tmp_path, 'model = ["smol=/m/smol.gguf"]\nctx = 2048\n[models.gemma]\npath = "g.gguf"\nctx = 1024\n'
                          'slots = 4\nkeep_alive = "5m"\nchat_template_file = "g.jinja"\n')
    m = to_config(load({}, file).settings).model
    assert m.more == (("gemma", tmp_path.resolve() / "g.gguf"),)  # after the file's list, relative to the file
    template = tmp_path.resolve() / "g.jinja"
    assert m.options_for("gemma") == ModelOptions(n_ctx=1024, n_slots=4, chat_template_file=template)
    assert m.options_for("smol") == ModelOptions() and m.n_ctx == 2048
    assert m.keep_alive_s("gemma") == 300.0
    flags = to_config(load({"model": ["a=/a.gguf"], "model_option": ["a:threads=1", "a:version=v2",
                                                                     "a:kv_cache_bytes=0"]}).settings).model
    assert flags.options_for("a") == ModelOptions(n_threads=1, version="v2", kv_cache_bytes=0)
    with pytest.raises(ValueError, match="no local model is named b"):
        to_config(load({"model": ["a=/a.gguf"], "model_option": ["b:ctx=5"]}).settings)
    for bad in ("a:ctx=0", "a:speed=9", "a=ctx:5", "actx=5"):
        with pytest.raises(SettingsError, match="model_option"):
            load({}, toml(tmp_path, f'model_option = ["{bad}"]\n'))
    with pytest.raises(SettingsError, match="needs a path"):
        load({}, toml(tmp_path, "[models.x]\nctx = 5\n"))
