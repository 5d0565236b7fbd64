"""The value types every setting is checked with, wherever it came from: a flag, an environment variable or the
TOML file. One function per type, shared by the settings model (settings/model.py) and argparse (cli/types.py):
each takes the text of a flag or variable, or the value a TOML file typed, and returns the value or raises
ValueError with a message that says what is expected (never echoing a secret)."""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from typing import Any

from sluicegate.hostnames import parse_pattern

Parse = Callable[[Any], Any]
LOG_LEVELS = ("debug", "info", "warning", "error", "critical")
LOG_FORMATS = ("text", "json")


def _number(value: Any, unit: str) -> float:
    if isinstance(value, bool):
        raise ValueError(f"not a number of {unit}: a boolean")
    if isinstance(value, int | float):
        return float(value)
    try:
        return float(str(value).strip())
    except ValueError:
        raise ValueError(f"not a number of {unit}: {str(value)[:40]!r}") from None


def _whole(value: Any) -> int:
    if isinstance(value, bool):
        raise ValueError("not a whole number: a boolean")
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    try:
        return int(str(value).strip())
    except ValueError:
        raise ValueError(f"not a whole number: {str(value)[:40]!r}") from None


def positive_int(value: Any) -> int:
    """A whole number of at least 1."""
    n = _whole(value)
    if n < 1:
        raise ValueError(f"must be at least 1, not {n}")
    return n


def nonnegative_int(value: Any) -> int:
    """A whole number of at least 0."""
    n = _whole(value)
    if n < 0:
        raise ValueError(f"must be at least 0, not {n}")
    return n


def port(value: Any) -> int:
    """A TCP port, 0 (any free one) to 65535."""
    n = _whole(value)
    if not 0 <= n <= 65535:
        raise ValueError(f"a port is 0 to 65535, not {n}")
    return n


def _positive(value: Any, unit: str, extra: str = "") -> float:
    x = _number(value, unit)
    if not 0 < x < math.inf:
        raise ValueError(f"must be a positive number of {unit}{extra}")
    return x


def positive_seconds(value: Any) -> float:
    """A positive, finite number of seconds."""
    return _positive(value, "seconds")


def nonnegative_seconds(value: Any) -> float:
    """Zero or a positive, finite number of seconds."""
    x = _number(value, "seconds")
    if not 0 <= x < math.inf:
        raise ValueError("must be zero or a positive number of seconds")
    return x


def positive_hours(value: Any) -> float:
    """A positive, finite number of hours."""
    return _positive(value, "hours")


def positive_days(value: Any) -> float:
    """A positive, finite number of days."""
    return _positive(value, "days")


def seconds_or_none(value: Any) -> float | None:
    """A positive, finite number of seconds, or `none`."""
    if value is None or (isinstance(value, str) and value.strip().lower() == "none"):
        return None
    return _positive(value, "seconds", ", or none")


def speculative(value: Any) -> str | int:
    """`auto` or a whole number of drafts, 0 (off) or more."""
    if isinstance(value, str) and value.strip() == "auto":
        return "auto"
    return nonnegative_int(value)


def log_level(value: Any) -> str:
    """One of the logging levels, in any case."""
    level = str(value).strip().lower()
    if level not in LOG_LEVELS:
        raise ValueError(f"the log level is one of {', '.join(LOG_LEVELS)}")
    return level


def model_name(name: str) -> str:
    """A local model's served NAME: 1 to 64 letters, digits, `.`, `_`, `-`, starting with a letter or digit."""
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}", name):
        raise ValueError("a model's NAME is 1 to 64 letters, digits, '.', '_' or '-', starting with a letter or digit")
    return name


def model_spec(value: Any) -> str:
    """A GGUF path, or NAME=PATH (NAME: the served name, letters, digits, `.`, `_`, `-`)."""
    spec = text(value)
    name, sep, path = spec.partition("=")
    if sep:
        model_name(name)
    if sep and not path:
        raise ValueError("NAME=GGUF needs the GGUF's path after '='")
    return spec


_DURATION_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0}


def duration_s(value: Any) -> float:
    """Ollama's keep_alive duration: seconds (`300`), or with a unit (`90s`, `5m`, `1h`); negative: forever."""
    raw = text(value).strip().lower()
    unit = _DURATION_UNITS.get(raw[-1:]) if raw[-1:].isalpha() else 1.0
    number = raw[:-1] if raw[-1:].isalpha() else raw
    try:
        x = float(number) * (unit if unit is not None else math.nan)
    except ValueError:
        x = math.nan
    if not math.isfinite(x):
        raise ValueError("a duration is seconds (300) or a number with s, m or h (5m); negative: forever")
    return x


def keep_alive(value: Any) -> str:
    """DURATION, or NAME=DURATION (NAME: a local model's served name)."""
    spec = text(value)
    name, sep, rest = spec.rpartition("=")
    if sep:
        model_name(name)
    duration_s(rest if sep else spec)
    return spec


MODEL_OPTIONS: dict[str, Callable[[Any], Any]] = {}  # a local model's own settings (`--model-option`), filled below


def model_option(value: Any) -> str:
    """NAME:KEY=VALUE: one setting of one local model (KEY: one of `MODEL_OPTIONS`), its VALUE checked."""
    spec = text(value)
    name, sep, rest = spec.partition(":")
    key, eq, val = rest.partition("=")
    if not sep or not eq:
        raise ValueError("a model option is NAME:KEY=VALUE (gemma:ctx=1024)")
    model_name(name)
    if key not in MODEL_OPTIONS:
        raise ValueError(f"a model option's KEY is one of {', '.join(MODEL_OPTIONS)}, not {key!r}")
    MODEL_OPTIONS[key](val)
    return spec


REASONING_FORMATS = ("auto", "deepseek", "none")


def reasoning_format(value: Any) -> str:
    """How a thinking model's reasoning is returned (llama-server's `--reasoning-format` values)."""
    fmt = str(value).strip().lower()
    if fmt not in REASONING_FORMATS:
        raise ValueError(f"the reasoning format is one of {', '.join(REASONING_FORMATS)}")
    return fmt


def log_format(value: Any) -> str:
    """`text` (a line for people) or `json` (one object a line, for a log pipeline)."""
    fmt = str(value).strip().lower()
    if fmt not in LOG_FORMATS:
        raise ValueError(f"the log format is one of {', '.join(LOG_FORMATS)}")
    return fmt


def host_pattern(value: Any) -> str:
    """One `--allowed-hosts` entry: `*`, `*.example.com`, a host name or an IP address."""
    return parse_pattern(str(value))


def network(value: Any) -> str:
    """An IP address or CIDR network (`10.0.0.0/8`, `::1`)."""
    from sluicegate.webhooks.ssrf import parse_networks

    text = str(value).strip()
    parse_networks([text])
    return text


def cors_origin(value: Any) -> str:
    """A browser origin, `scheme://host[:port]` without a path, or `*` (any origin)."""
    from urllib.parse import urlsplit

    text = str(value).strip().rstrip("/")
    if text == "*":
        return text
    parts = urlsplit(text)
    if parts.scheme not in ("http", "https") or not parts.hostname or parts.path or parts.query or parts.fragment:
        raise ValueError(f"an origin is scheme://host[:port] (no path), or *; not {text[:80]!r}")
    return f"{parts.scheme}://{parts.netloc.lower()}"


def docs_url(value: Any) -> str:
    """An http(s) URL with a host, or a path on this server (`/docs/errors`, the default: relative to the server
    that answered), with no fragment, in printable ASCII (an error's anchor is appended to it)."""
    from urllib.parse import urlsplit

    text = str(value).strip()
    parts = urlsplit(text)
    # a path: one leading `/` and no `\` (a browser reads `//host` and `/\host` as another host)
    path = text.startswith("/") and not text.startswith("//") and "\\" not in text
    if ((not path and (parts.scheme not in ("http", "https") or not parts.hostname)) or "#" in text
            or len(text) > 512 or not (text.isascii() and text.isprintable()) or " " in text):
        raise ValueError("a docs URL is an http(s) URL with a host, or a path on this server (/docs/errors), with "
                         f"no #fragment, at most 512 printable ASCII characters; not {text[:80]!r}")
    return text


def text(value: Any) -> str:
    """Any text (a name, a URL)."""
    if isinstance(value, dict | list):
        raise ValueError("must be a single value, not a table or a list")
    return str(value)


def flag_bool(value: Any) -> bool:
    """true/false, on/off, yes/no, 1/0 (a TOML boolean, or the text of a variable)."""
    if isinstance(value, bool):
        return value
    word = str(value).strip().lower()
    if word in ("1", "true", "on", "yes"):
        return True
    if word in ("0", "false", "off", "no"):
        return False
    raise ValueError(f"not a boolean (true/false): {word[:20]!r}")


def split_list(value: Any) -> list[Any]:
    """A list setting from a variable (comma-separated), a TOML array, or repeated flags (already a list)."""
    if value is None:
        return []
    if isinstance(value, list | tuple):
        return list(value)
    return [part.strip() for part in str(value).split(",") if part.strip()]


__all__ = ["LOG_FORMATS", "LOG_LEVELS", "Parse", "cors_origin", "docs_url", "flag_bool", "host_pattern", "log_format",
           "log_level", "network", "nonnegative_int", "nonnegative_seconds", "port", "positive_days",
           "positive_hours", "positive_int", "positive_seconds", "seconds_or_none", "speculative", "split_list",
           "text"]


MODEL_OPTIONS.update(ctx=positive_int, slots=positive_int, threads=positive_int, chat_template_file=text,
                     keep_alive=duration_s, version=text, kv_cache_bytes=nonnegative_int)
