"""`config show`: the effective settings as a TOML file would hold them, each with where it came from, and
every secret redacted by sluicegate/redaction.py: the database URL as SQLAlchemy reads it (user, host, port and
database shown; password and query values `***`), any other URL with its user information and query `***`
(the upstream URLs too, which are not secrets but may carry credentials), any other secret `***`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from sluicegate import __version__, redaction
from sluicegate.settings.groups import GROUPS
from sluicegate.settings.model import FIELDS, Loaded, flag_for

ORDER = tuple(name for group in GROUPS for name in group.model_fields)  # as `serve --help` lists them

MASK = redaction.MASK


def redact(value: str, name: str = "") -> str:
    """A secret (or a setting that may hold one) as it may be shown; `name`: the setting's."""
    if name == "database_url":
        return redaction.database_url(value)
    if name == "upstream":  # [NAME=]URL
        model, sep, rest = value.partition("=")
        if sep and "://" not in model:
            return f"{model}={redaction.url(rest)}"
    return redaction.url(value)


SHOWN_REDACTED = ("upstream",)  # not secrets, but they may carry credentials in a URL


def _toml(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, Path):
        value = str(value)
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    return json.dumps(str(value))  # a TOML basic string (JSON's escapes are TOML's)


def render(loaded: Loaded) -> str:
    """One `key = value  # source` line per setting, in the groups' order; an unset optional one commented out."""
    s = loaded.settings
    lines = [f"# sluicegate {__version__}: the effective configuration of `serve` (secrets redacted)",
             f"# file: {loaded.config_file or 'none'}; precedence: flag > SLUICEGATE_* environment > file > default"]
    lines += [f"# warning: {w}" for w in loaded.warnings]
    width = max(len(n) for n in FIELDS)
    for name in ORDER:
        value = getattr(s, name)
        where = loaded.origin[name]
        if value is None:
            lines.append(f"# {name.ljust(width)}   (unset)  # {where}")
            continue
        if flag_for(name).secret:
            shown = _toml(redact(str(value), name))
        elif name in SHOWN_REDACTED:
            shown = _toml([redact(str(v), name) for v in value])
        else:
            shown = _toml(value)
        lines.append(f"{name.ljust(width)} = {shown}  # {where}")
    return "\n".join(lines) + "\n"


__all__ = ["MASK", "redact", "render"]
