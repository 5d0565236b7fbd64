"""The command line: `sluicegate serve | config show | keys | db | jobs | probe | compat`.

One module per command family (serve, config_cmd, keys (and db), jobs); `serve`'s flags are generated from the
settings model (cli/options.py), and every command checks values with the same types (cli/types.py).
"""

from __future__ import annotations

import argparse
import sys
from importlib import metadata

from sluicegate import __version__


def version_text() -> str:
    """`sluicegate --version`: this package's version and the engine library's."""
    try:
        llama = metadata.version("llama-cpp-python")
    except metadata.PackageNotFoundError:
        llama = "absent"
    return f"sluicegate {__version__} (llama-cpp-python {llama}, Python {sys.version.split()[0]})"


def parser() -> argparse.ArgumentParser:
    from sluicegate.cli import config_cmd, jobs, keys, serve

    p = argparse.ArgumentParser(prog="sluicegate", description="An LLM inference server whose boundary is a contract.")
    p.add_argument("--version", action="version", version=version_text())
    sub = p.add_subparsers(dest="command", required=True)
    serve.add_parser(sub)
    config_cmd.add_parser(sub)
    keys.add_parsers(sub)
    jobs.add_parsers(sub)
    sub.add_parser("probe", help="grade a server's boundary with awkward requests (probe --help)")
    sub.add_parser("compat", help="classify schema changes as compatible or breaking (compat --help)")
    return p


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    # Tools with their own argument parsers get everything after their name untouched.
    if argv and argv[0] == "probe":
        from sluicegate.contract import probe_cli

        return probe_cli.main(argv[1:])
    if argv and argv[0] == "compat":
        from sluicegate.contract import compat as compat_cli

        return compat_cli.main(argv[1:])
    args = parser().parse_args(argv)
    if args.command in ("keys", "db"):
        from sluicegate.cli import keys

        return keys.run(args)
    if args.command == "jobs":
        from sluicegate.cli import jobs

        return jobs.run(args)
    if args.command == "config":
        from sluicegate.cli import config_cmd

        return config_cmd.run(args)
    from sluicegate.cli import serve

    return serve.run(args)


if __name__ == "__main__":
    sys.exit(main())
