"""`config show`: the effective settings as a TOML file would hold them, each with where it came from, and
every secret redacted (a URL keeps its scheme, user, host and path; its password and query become `***`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from sluicegate import __version__
from sluicegate.settings.groups import GROUPS
from sluicegate.settings.model import FIELDS, Loaded, flag_for

ORDER = tuple(name for group in GROUPS for name in group.model_fields)  # as `serve --help` lists them

MASK = "***"


def redact(value: str) -> str:
    """A secret as it may be shown: a URL without its password and query, anything else as `***`."""
    parts = urlsplit(value)
    if not parts.scheme or not parts.netloc or "://" not in value:
        return MASK
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    netloc = host + (f":{parts.port}" if parts.port is not None else "")
    if parts.username is not None or parts.password is not None:
        user = parts.username or ""
        netloc = f"{user}{':' + MASK if parts.password is not None else ''}@{netloc}"
    return urlunsplit((parts.scheme, netloc, parts.path, MASK if parts.query else "", ""))


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
        shown = _toml(redact(str(value))) if flag_for(name).secret else _toml(value)
        lines.append(f"{name.ljust(width)} = {shown}  # {where}")
    return "\n".join(lines) + "\n"


__all__ = ["MASK", "redact", "render"]
