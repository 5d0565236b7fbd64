"""docs/errors.md's catalog section, generated from the error catalog (src/sluicegate/errorcatalog/).

The lines between the two markers are the catalog as one table, a row for each type and each code, each row
opening with its anchor (`<a name="invalid_request-unknown_field">`): the place an envelope's `docs_url` points
at. The rest of the document is written by hand. A test compares the section with this rendering, so a code
added to the catalog without `make errors-doc` fails the build.

    python -m sluicegate.contract.errors_doc                # print the section
    python -m sluicegate.contract.errors_doc --write PATH   # refresh the section in PATH
    python -m sluicegate.contract.errors_doc --check PATH   # exit 0 when PATH holds it as rendered, 1 otherwise
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

from sluicegate.errorcatalog import ENTRIES

__all__ = ["BEGIN", "END", "REFRESH_COMMAND", "anchors", "main", "render", "splice"]

REFRESH_COMMAND = "make errors-doc"
BEGIN = f"<!-- the catalog: generated from src/sluicegate/errorcatalog/ by `{REFRESH_COMMAND}`; do not edit -->"
END = "<!-- end of the catalog -->"


def render() -> str:
    """The section, markers included."""
    rows = ["| type / code | status | meaning | what to do |", "| --- | --- | --- | --- |"]
    for e in ENTRIES:
        name = f"**`{e.type}`**" if e.code is None else f"`{e.type}` / `{e.code}`"
        rows.append(f'| <a name="{e.anchor}"></a>{name} | {e.status} | {e.meaning} | {e.action} |')
    return "\n".join([BEGIN, *rows, END])


def anchors(markdown: str) -> set[str]:
    """The anchors a Markdown document defines: its `<a name="...">` (or `id`) and its headings as GitHub slugs
    them (lower case; punctuation but `-` and `_` dropped; spaces to `-`)."""
    named = set(re.findall(r'<a (?:name|id)="([^"]+)"', markdown))
    slugs = {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-")
             for h in re.findall(r"^#+ (.+)$", markdown, re.M)}
    return named | slugs


def splice(text: str, section: str) -> str:
    """`text` with the lines from BEGIN to END (both included) replaced by `section`."""
    start, end = text.find(BEGIN), text.find(END)
    if start < 0 or end < start:
        raise ValueError(f"the document has no catalog section: put the lines {BEGIN!r} and {END!r} where it goes")
    return text[:start] + section + text[end + len(END):]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m sluicegate.contract.errors_doc",
                                description="Print, write or check docs/errors.md's catalog section.")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--write", metavar="PATH", type=Path, help="refresh the section in PATH")
    g.add_argument("--check", metavar="PATH", type=Path, help="exit 1 unless PATH holds the section as rendered")
    args = p.parse_args(argv)
    section = render()
    if args.write is not None:
        args.write.write_text(splice(args.write.read_text(encoding="utf-8"), section), encoding="utf-8")
        print(f"wrote the catalog into {args.write}", file=sys.stderr)
        return 0
    if args.check is not None:
        text = args.check.read_text(encoding="utf-8")
        if splice(text, section) != text:
            print(f"{args.check}: the catalog section is out of date; run `{REFRESH_COMMAND}`", file=sys.stderr)
            return 1
        return 0
    print(section)
    return 0


if __name__ == "__main__":
    sys.exit(main())
