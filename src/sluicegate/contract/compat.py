"""`sluicegate compat OLD.json NEW.json`: say whether a contract change is safe for deployed clients.

Exit status: 0 when every change is compatible, 1 when any is breaking, 2 on a usage error.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from sluicegate.contract.diff_schemas import Change, SchemaError, diff_openapi, diff_schemas

_PROG = "sluicegate compat"


class _UsageError(Exception):
    pass


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=_PROG,
        description="Classify the changes between two OpenAPI documents or two JSON Schemas as compatible "
        "or breaking for clients built against OLD.",
    )
    p.add_argument("old", metavar="OLD.json", help="the contract clients were built against")
    p.add_argument("new", metavar="NEW.json", help="the contract about to ship")
    p.add_argument("--reader", choices=("tolerant", "strict"), default="tolerant",
                   help="whether old clients ignore (tolerant) or reject (strict) unknown response fields")
    p.add_argument("--direction", choices=("request", "response"),
                   help="which side of the wire two bare schemas describe (required for bare schemas)")
    return p


def _load(path: str) -> dict[str, Any]:
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise _UsageError(f"cannot read {path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise _UsageError(f"cannot read {path}: not UTF-8 text") from None
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        where = f"line {exc.lineno} column {exc.colno}"
        raise _UsageError(f"{path}: invalid JSON: {exc.msg} at {where}") from None
    if not isinstance(doc, dict):
        raise _UsageError(f"{path}: expected a JSON object, got {type(doc).__name__}")
    return doc


def render(changes: list[Change]) -> str:
    """One aligned row per change, then the totals a reviewer reads first."""
    rows = [(c.path, c.kind, "BREAKING" if c.breaking else "compatible", c.reason) for c in changes]
    header = ("PATH", "KIND", "STATUS", "REASON")
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(3)]
    lines = ["  ".join([*(cell.ljust(w) for cell, w in zip(r[:3], widths, strict=True)), r[3]]).rstrip()
             for r in [header, *rows]] if rows else ["no changes"]
    breaking = sum(c.breaking for c in changes)
    lines.append(f"{len(changes)} change{'s' * (len(changes) != 1)}: {breaking} breaking, "
                 f"{len(changes) - breaking} compatible")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Gate a release on the contract: a non-zero exit stops a change that would break deployed clients."""
    try:
        args = _parser().parse_args(argv)
    except SystemExit as exc:  # argparse has already printed usage and the error (or --help)
        return exc.code if isinstance(exc.code, int) else 2
    try:
        old, new = _load(args.old), _load(args.new)
        old_api, new_api = "openapi" in old, "openapi" in new
        if old_api != new_api:
            raise _UsageError("one file is an OpenAPI document and the other is not; compare like with like")
        if old_api:
            if args.direction is not None:
                raise _UsageError("--direction applies to bare schemas; OpenAPI documents imply it")
            changes = diff_openapi(old, new, reader=args.reader)
        else:
            if args.direction is None:
                raise _UsageError("--direction request|response is required when comparing bare schemas")
            changes = diff_schemas(old, new, args.direction, reader=args.reader)
    except (_UsageError, SchemaError) as exc:
        print(f"{_PROG}: error: {exc}", file=sys.stderr)
        return 2
    except (TypeError, AttributeError) as exc:  # a keyword with the wrong JSON type, e.g. "properties": []
        print(f"{_PROG}: error: malformed schema ({exc})", file=sys.stderr)
        return 2
    print(render(changes))
    return 1 if any(c.breaking for c in changes) else 0
