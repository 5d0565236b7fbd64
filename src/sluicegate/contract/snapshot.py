"""The committed OpenAPI snapshot, `docs/openapi.json`, and the gate that keeps the served contract equal.

The document is produced from an app on the reference backend with the default config, so it is the same on
every machine and whichever model a server would load: the contract of `/v1` does not depend on the weights.
A test compares it with the snapshot. A breaking difference fails unless `info.version`'s major component was
bumped; any other difference fails asking for a refresh (`make openapi`), so the snapshot moves in the same
commit as the change that moved the contract.

    python -m sluicegate.contract.snapshot                  # print the served document
    python -m sluicegate.contract.snapshot --write PATH     # refresh the snapshot
    python -m sluicegate.contract.snapshot --check PATH     # the gate: exit 0 equal, 1 otherwise
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from sluicegate.contract.diff_schemas import Change, diff_openapi

__all__ = ["REFRESH_COMMAND", "Verdict", "check", "dump", "load", "main", "served_document"]

REFRESH_COMMAND = "make openapi"
Status = Literal["equal", "refresh", "breaking"]


def served_document() -> dict[str, Any]:
    """The OpenAPI document the server serves at `/openapi.json`, as plain JSON data.

    Only the app's routes and schemas shape it; the factory is never called (no lifespan runs), and the
    config is the default one, so neither the model nor the machine can leak into the contract.
    """
    from sluicegate.api.app import create_app
    from sluicegate.backends.reference import ReferenceRunner
    from sluicegate.config import Config

    app = create_app(Config(), lambda: ReferenceRunner())
    # A JSON round trip turns integer status keys into strings and tuples into lists, as a client reads it.
    doc: dict[str, Any] = json.loads(json.dumps(app.openapi()))
    return doc


def dump(doc: dict[str, Any]) -> str:
    """The snapshot's text: sorted keys and 2-space indent, so a diff shows only what changed."""
    return json.dumps(doc, sort_keys=True, indent=2, ensure_ascii=False) + "\n"


def load(path: str | Path) -> dict[str, Any]:
    doc = json.loads(Path(path).read_text(encoding="utf-8"))
    if not isinstance(doc, dict):
        raise ValueError(f"{path}: expected a JSON object, got {type(doc).__name__}")
    return doc


@dataclass(frozen=True)
class Verdict:
    """How the served document relates to the snapshot, and what the developer has to do about it."""

    status: Status
    changes: tuple[Change, ...]
    message: str

    @property
    def ok(self) -> bool:
        return self.status == "equal"

    @property
    def breaking(self) -> list[Change]:
        return [c for c in self.changes if c.breaking]


def _major(doc: dict[str, Any]) -> int | None:
    info = doc.get("info")
    version = info.get("version") if isinstance(info, dict) else None
    m = re.match(r"\s*v?(\d+)", version) if isinstance(version, str) else None
    return int(m.group(1)) if m else None


def _rows(changes: list[Change]) -> str:
    return "\n".join(f"  {c.path}: {c.kind} ({'BREAKING' if c.breaking else 'compatible'}): {c.reason}"
                     for c in changes)


def check(snapshot: dict[str, Any], served: dict[str, Any]) -> Verdict:
    """Judge the served document against the committed snapshot (tolerant readers).

    Equal means equal as JSON data: key order and formatting do not count. A breaking change is accepted
    only together with a bump of `info.version`'s major component; even then the snapshot must be refreshed.
    """
    if snapshot == served:
        return Verdict("equal", (), "the served OpenAPI document equals the snapshot")
    changes = diff_openapi(snapshot, served, reader="tolerant")
    breaking = [c for c in changes if c.breaking]
    old_major, new_major = _major(snapshot), _major(served)
    bumped = old_major is not None and new_major is not None and new_major > old_major
    if breaking and not bumped:
        return Verdict("breaking", tuple(changes), (
            f"the served OpenAPI document breaks the committed contract in {len(breaking)} place"
            f"{'s' * (len(breaking) != 1)}, and info.version's major component was not bumped "
            f"({_version(snapshot)} -> {_version(served)}):\n{_rows(breaking)}\n"
            "Make the change containment-safe (docs/versioning.md), or ship it under a new API version."))
    if changes:
        what = (f"{len(changes)} change{'s' * (len(changes) != 1)}"
                + (f", {len(breaking)} breaking, allowed by the major version bump" if breaking
                   else ", all compatible"))
        detail = f"{what}:\n{_rows(changes)}\n"
    else:
        detail = "no schema change (descriptions, titles, examples or the version differ)\n"
    return Verdict("refresh", tuple(changes), (
        f"the served OpenAPI document differs from the snapshot: {detail}"
        f"Refresh the snapshot with `{REFRESH_COMMAND}` and commit it with the change."))


def _version(doc: dict[str, Any]) -> str:
    info = doc.get("info")
    return str(info.get("version")) if isinstance(info, dict) else "None"


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m sluicegate.contract.snapshot",
                                description="Print, write or check the OpenAPI snapshot.")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--write", metavar="PATH", type=Path, help="write the served document to PATH")
    g.add_argument("--check", metavar="PATH", type=Path,
                   help="compare the served document with the snapshot at PATH; exit 1 unless equal")
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    served = served_document()
    if args.write is not None:
        args.write.write_text(dump(served), encoding="utf-8")
        print(f"wrote {args.write}", file=sys.stderr)
        return 0
    if args.check is not None:
        verdict = check(load(args.check), served)
        print(verdict.message, file=sys.stdout if verdict.ok else sys.stderr)
        return 0 if verdict.ok else 1
    sys.stdout.write(dump(served))
    return 0


if __name__ == "__main__":
    sys.exit(main())
