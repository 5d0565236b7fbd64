"""docs/errors.md's catalog section, generated from the error catalog (src/sluicegate/errorcatalog/).

The lines between the two markers are the catalog as one table, a row for each type and each code, each row
opening with its anchor (`<a name="invalid_request-unknown_field">`): the place an envelope's `docs_url` points
at. The rest of the document is written by hand. A test compares the section with this rendering, so a code
added to the catalog without `make errors-doc` fails the build.

`page()` renders the same entries as an HTML page, each entry an element whose `id` is its anchor: the server
serves it at `GET /docs/errors` (api/routes/error_docs.py), where the default `docs_url` points.

    python -m sluicegate.contract.errors_doc                # print the section
    python -m sluicegate.contract.errors_doc --write PATH   # refresh the section in PATH
    python -m sluicegate.contract.errors_doc --check PATH   # exit 0 when PATH holds it as rendered, 1 otherwise
"""

from __future__ import annotations

import argparse
import html
import re
import sys
from pathlib import Path

from sluicegate.errorcatalog import ENTRIES

__all__ = ["BEGIN", "END", "REFRESH_COMMAND", "anchors", "main", "page", "render", "splice"]

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


def page() -> str:
    """The catalog as an HTML page: a heading, then a section per type and per code (in the document's order),
    its `id` the entry's anchor, with the status, the meaning and what to do. Every text is escaped."""
    out = ['<!DOCTYPE html>', '<html lang="en">', '<head>', '<meta charset="utf-8">',
           '<meta name="viewport" content="width=device-width, initial-scale=1">',
           '<title>sluicegate: error catalog</title>', '</head>', '<body>', '<h1>sluicegate: error catalog</h1>',
           "<p>Every error the server sends, by its <code>type</code> and <code>code</code>. Each error's "
           "<code>docs_url</code> links its entry here; a client that does not know a code acts on its type.</p>"]
    for e in ENTRIES:
        name = html.escape(e.type if e.code is None else f"{e.type} / {e.code}")
        heading = "h2" if e.code is None else "h3"
        out += [f'<section id="{html.escape(e.anchor)}">',
                f"<{heading}><code>{name}</code> ({e.status})</{heading}>",
                f"<p>{html.escape(e.meaning)}</p>",
                f"<p>What to do: {html.escape(e.action)}</p>",
                "</section>"]
    return "\n".join([*out, "</body>", "</html>", ""])


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
