"""The settings model as flags: every field one long flag (`max_new_tokens` is `--max-new-tokens`), in the
groups' sections of `--help`; a boolean also has its `--no-` form; a list repeats. Nothing has an argparse
default, so `given` sees only the flags on the command line and the environment, the file and the defaults
below them keep their place (settings/model.py)."""

from __future__ import annotations

import argparse
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from sluicegate.cli.types import argtype
from sluicegate.settings.groups import GROUPS, Group
from sluicegate.settings.model import CONFIG_ENV, FIELDS, env_name, flag_for
from sluicegate.settings.types import Parse, split_list

PRECEDENCE = ("Every option is also an environment variable, SLUICEGATE_ and its name in capitals "
              "(--max-new-tokens: SLUICEGATE_MAX_NEW_TOKENS), and a key of the --config TOML file "
              "(max_new_tokens = 512); a flag beats the environment, which beats the file. Secrets also from a "
              "file: SLUICEGATE_DATABASE_URL_FILE, SLUICEGATE_REDIS_URL_FILE, SLUICEGATE_UPSTREAM_KEY_FILE. "
              "`sluicegate config show` prints the result.")


def add_config_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", type=Path, default=None, metavar="FILE.toml",
                   help=f"a TOML file of settings (default: the {CONFIG_ENV} variable, else none)")


def _default_text(name: str) -> str:
    default = FIELDS[name].default
    if default is None or default == [] or isinstance(default, bool):
        return ""
    return f" (default {default})"


def add_settings_args(p: argparse.ArgumentParser, groups: Iterable[type[Group]] = GROUPS,
                      only: Iterable[str] | None = None) -> None:
    """One flag per setting of `groups` (or only the settings named in `only`)."""
    wanted = set(only) if only is not None else None
    for group in groups:
        names = [n for n in group.model_fields if wanted is None or n in wanted]
        if not names:
            continue
        section = p.add_argument_group(group.TITLE)
        for name in names:
            flag = flag_for(name)
            info = FIELDS[name]
            opt = "--" + name.replace("_", "-")
            help_ = f"{' '.join((info.description or '').split())}{_default_text(name)} [{env_name(name)}]"
            if info.annotation is bool:
                section.add_argument(opt, action=argparse.BooleanOptionalAction, default=argparse.SUPPRESS,
                                     help=help_)
            elif flag.repeat:
                section.add_argument(opt, action="append", type=_each(flag.parse), default=argparse.SUPPRESS,
                                     metavar=flag.metavar, help=help_)
            else:
                section.add_argument(opt, type=argtype(flag.parse), default=argparse.SUPPRESS, metavar=flag.metavar,
                                     help=help_)


def _each(parse: Parse) -> Callable[[str], str]:
    """A repeated flag's type: each comma-separated part checked, the text kept (the model splits it)."""

    def check(value: str) -> str:
        parts = split_list(value)
        if not parts:
            raise ValueError("no value given")
        for part in parts:
            parse(part)
        return value

    check.__name__ = parse.__name__
    return argtype(check)


def given(args: argparse.Namespace) -> dict[str, Any]:
    """The settings given as flags."""
    return {k: v for k, v in vars(args).items() if k in FIELDS}


__all__ = ["PRECEDENCE", "add_config_arg", "add_settings_args", "given"]
