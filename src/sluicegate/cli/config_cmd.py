"""`sluicegate config show`: the configuration `serve` would run with, each value with where it came from,
secrets redacted; exit 2 with the reason for one that cannot be used (an unknown key in the file, a bad value)."""

from __future__ import annotations

import argparse
import sys

from sluicegate.cli.options import PRECEDENCE, add_config_arg, add_settings_args, given
from sluicegate.settings import SettingsError, load, render, to_config


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    config = sub.add_parser("config", help="the effective configuration (config show)")
    csub = config.add_subparsers(dest="config_command", required=True)
    show = csub.add_parser("show", help="print serve's settings and where each came from, secrets redacted; takes "
                           "serve's flags", epilog=PRECEDENCE)
    add_config_arg(show)
    add_settings_args(show)


def run(args: argparse.Namespace) -> int:
    try:
        loaded = load(given(args), args.config)
        to_config(loaded.settings)  # the combinations serve would refuse are refused here too
    except (SettingsError, ValueError) as exc:
        print(f"sluicegate: {exc}", file=sys.stderr)
        return 2
    sys.stdout.write(render(loaded))
    return 0


__all__ = ["add_parser", "run"]
