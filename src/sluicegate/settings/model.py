"""The settings model and how it is read: flag > `SLUICEGATE_*` environment > TOML file > default.

- Flags: the long flag of each field (`--max-new-tokens`), only those given count (cli/options.py).
- Environment: `SLUICEGATE_` + the field's name in capitals (`SLUICEGATE_MAX_NEW_TOKENS=512`); an empty
  variable counts as unset; a list is comma-separated. A secret (`database_url`, `redis_url`, `upstream_key`)
  may come from a file instead: `SLUICEGATE_DATABASE_URL_FILE=/run/secrets/db` (its content, trailing newline
  dropped); setting both the variable and its `_FILE` is refused.
- The TOML file: `--config FILE` or `SLUICEGATE_CONFIG=FILE`; top-level keys named after the fields
  (`max_new_tokens = 512`), lists as arrays. An unknown key is refused by name (with the nearest known one), so
  a typo never silently does nothing. A relative path in the file (`data_dir`, `model`) is relative to the
  file's directory, so every command that reads the file finds the same store wherever it runs.

`load` returns the settings with where each value came from (`config show` prints both, secrets redacted). The
value types are checked the same way from every source (settings/types.py); a bad value is refused naming its
source. Nothing below the CLI reads the environment: the settings become the frozen `Config` (settings/convert.py).
"""

from __future__ import annotations

import difflib
import os
import tomllib
from collections.abc import Mapping
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import ValidationError, field_validator
from pydantic_settings import (
    BaseSettings,
    EnvSettingsSource,
    InitSettingsSource,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
)

from sluicegate.settings.flag import Flag, flag_of
from sluicegate.settings.groups import (
    ConnectionSettings,
    HttpSettings,
    JobSettings,
    LimitSettings,
    ModelSettings,
    RateLimitSettings,
    StoreSettings,
    UpstreamSettings,
    WebhookSettings,
)

ENV_PREFIX = "SLUICEGATE_"
CONFIG_ENV = ENV_PREFIX + "CONFIG"
# variables of the same prefix that are not `serve` settings: the jobs client's, the test suite's, and two the
# backends read (the weights' digest cache, llama.cpp's own log)
OTHER_VARIABLES = frozenset({CONFIG_ENV, "SLUICEGATE_API_KEY", "SLUICEGATE_URL", "SLUICEGATE_TEST_POSTGRES",
                             "SLUICEGATE_CACHE_DIR", "SLUICEGATE_LLAMA_LOG"})
PATH_FIELDS = ("data_dir", "model")  # relative paths in the file are relative to the file


def _relative_model(spec: str, base: Path) -> str:
    name, sep, rest = spec.partition("=")
    file = rest if sep else name
    if Path(file).expanduser().is_absolute():
        return spec
    resolved = str(base.resolve() / file)
    return f"{name}={resolved}" if sep else resolved


class SettingsError(ValueError):
    """A configuration that cannot be used; the message names the setting and where its value came from."""


_LAYERS: ContextVar[tuple[dict[str, Any], dict[str, Any], dict[str, Any]]] = ContextVar("_LAYERS")


class ServeSettings(ModelSettings, HttpSettings, LimitSettings, ConnectionSettings, StoreSettings, RateLimitSettings,
                    JobSettings, WebhookSettings, UpstreamSettings, BaseSettings):
    """Every `serve` setting (settings/groups.py has them by concern)."""

    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, extra="forbid", frozen=True, case_sensitive=False,
                                      env_ignore_empty=True, protected_namespaces=())

    @field_validator("data_dir")
    @classmethod
    def _absolute(cls, value: Path) -> Path:
        return value.expanduser().resolve()  # once, here: every later use sees the same directory

    @classmethod
    def settings_customise_sources(
        cls, settings_cls: type[BaseSettings], init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource, dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        secret_files, file, defaults = _LAYERS.get(({}, {}, {}))
        return (init_settings, env_settings, InitSettingsSource(settings_cls, secret_files),
                InitSettingsSource(settings_cls, file), InitSettingsSource(settings_cls, defaults))


FIELDS = ServeSettings.model_fields


def flag_for(name: str) -> Flag:
    return flag_of(FIELDS[name].metadata)


SECRETS = tuple(name for name in FIELDS if flag_for(name).secret)


def env_name(name: str) -> str:
    return ENV_PREFIX + name.upper()


@dataclass(frozen=True, slots=True)
class Loaded:
    settings: ServeSettings
    origin: dict[str, str]  # field -> where its value came from ("default", "--ctx", "SLUICEGATE_CTX", "FILE")
    config_file: Path | None
    warnings: tuple[str, ...]  # e.g. a SLUICEGATE_ variable that is no setting (a typo?)


def _did_you_mean(name: str) -> str:
    close = difflib.get_close_matches(name, list(FIELDS), n=1)
    return f" (did you mean {close[0]}?)" if close else ""


def read_file(path: Path) -> dict[str, Any]:
    """The TOML file's settings; SettingsError for a file that cannot be read, is not TOML, or holds a key
    that is no setting."""
    try:
        with path.open("rb") as f:
            data = tomllib.load(f)
    except OSError as exc:
        raise SettingsError(f"the configuration file {path} cannot be read: {exc.strerror}") from None
    except tomllib.TOMLDecodeError as exc:
        raise SettingsError(f"the configuration file {path} is not valid TOML: {exc}") from None
    tables = data.pop("models", None)
    for key, value in data.items():
        if isinstance(value, dict):
            raise SettingsError(f"{path}: [{key}] is a table; settings are top-level keys (`ctx = 2048`)")
        if key not in FIELDS:
            raise SettingsError(f"{path}: unknown setting {key!r}{_did_you_mean(key)}; the settings are serve's long "
                                "flags with _ for - (sluicegate serve --help)")
        if key in PATH_FIELDS and isinstance(value, str) and not Path(value).expanduser().is_absolute():
            data[key] = str(path.parent.resolve() / value)
        elif key == "model" and isinstance(value, list):  # [NAME=]PATH entries
            data[key] = [_relative_model(str(v), path.parent) for v in value]
    if tables is not None:
        _model_tables(path, tables, data)
    return data


def _model_tables(path: Path, tables: Any, data: dict[str, Any]) -> None:
    """`[models.NAME]` tables (`path` and the keys of `--model-option`) as the flags would give them: each
    model's `NAME=PATH` after the file's `model` list, its options as `NAME:KEY=VALUE`."""
    if not isinstance(tables, dict) or not all(isinstance(t, dict) for t in tables.values()):
        raise SettingsError(f"{path}: models is a table of tables, one per model: [models.NAME] path = \"...\"")
    for name, table in tables.items():
        if "path" not in table:
            raise SettingsError(f"{path}: [models.{name}] needs a path (the GGUF)")
        entries = list(data.get("model", []))
        entries.append(_relative_model(f"{name}={table['path']}", path.parent))
        data["model"] = entries
        for key, value in table.items():
            if key == "path":
                continue
            if key == "chat_template_file" and isinstance(value, str):
                value = str(Path(path.parent.resolve() / Path(value).expanduser()))
            data["model_option"] = [*data.get("model_option", []), f"{name}:{key}={value}"]


def _secret_files() -> tuple[dict[str, Any], dict[str, str]]:
    values: dict[str, Any] = {}
    origin: dict[str, str] = {}
    for name in SECRETS:
        var = env_name(name) + "_FILE"
        path = os.environ.get(var)
        if not path:
            continue
        if os.environ.get(env_name(name)):
            raise SettingsError(f"both {env_name(name)} and {var} are set; set one")
        try:
            values[name] = Path(path).read_text(encoding="utf-8").rstrip("\r\n")
        except (OSError, UnicodeDecodeError) as exc:
            why = exc.strerror if isinstance(exc, OSError) else "not UTF-8 text"
            raise SettingsError(f"{var}: the file {path} cannot be read: {why}") from None
        origin[name] = f"{var} ({path})"
    return values, origin


def _unknown_variables() -> list[str]:
    known = {env_name(n) for n in FIELDS} | {env_name(n) + "_FILE" for n in SECRETS} | OTHER_VARIABLES
    return sorted(v for v in os.environ if v.upper().startswith(ENV_PREFIX) and v.upper() not in known)


def load(flags: Mapping[str, Any], config_file: Path | None = None, *,
         defaults: Mapping[str, Any] | None = None) -> Loaded:
    """The settings from `flags` (only those given), the environment, the file (`config_file`, else
    `SLUICEGATE_CONFIG`) and the defaults (`defaults` first: a program's own, below the file). SettingsError
    says what is wrong and where the value came from."""
    if config_file is None and os.environ.get(CONFIG_ENV):
        config_file = Path(os.environ[CONFIG_ENV])
    file = read_file(config_file) if config_file is not None else {}
    secret_files, secret_origin = _secret_files()
    env = EnvSettingsSource(ServeSettings, env_prefix=ENV_PREFIX, case_sensitive=False, env_ignore_empty=True)()
    origin = {name: "default" for name in FIELDS}
    origin.update({k: "default (this program's)" for k in defaults or {}})
    origin.update({k: str(config_file) for k in file})
    origin.update(secret_origin)
    origin.update({k: env_name(k) for k in env})
    origin.update({k: "--" + k.replace("_", "-") for k in flags})
    token = _LAYERS.set((secret_files, file, dict(defaults or {})))
    try:
        settings = ServeSettings(**flags)
    except ValidationError as exc:
        raise SettingsError(_explain(exc, origin)) from None
    finally:
        _LAYERS.reset(token)
    warnings = [f"{v} is not a setting{_did_you_mean(v[len(ENV_PREFIX):].lower())}; it is ignored"
                for v in _unknown_variables()]
    return Loaded(settings, origin, config_file, tuple(warnings))


def _explain(exc: ValidationError, origin: Mapping[str, str]) -> str:
    lines = []
    for err in exc.errors(include_input=False, include_url=False):
        name = str(err["loc"][0]) if err["loc"] else "?"
        msg = str(err["msg"]).removeprefix("Value error, ")
        if err["type"] == "extra_forbidden":
            msg = f"unknown setting{_did_you_mean(name)}"
        lines.append(f"{name} (from {origin.get(name, 'the command line')}): {msg}")
    return "; ".join(lines)


__all__ = ["CONFIG_ENV", "ENV_PREFIX", "FIELDS", "SECRETS", "Loaded", "ServeSettings", "SettingsError", "env_name",
           "flag_for", "load", "read_file"]
