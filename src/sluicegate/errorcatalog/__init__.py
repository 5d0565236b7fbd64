"""The error catalog: every error `type` and `code` the server sends, one table that docs/errors.md is generated
from (`make errors-doc`; tests/unit/test_error_catalog.py checks both ways) and that every envelope links to.

No HTTP machinery and no import of the rest of sluicegate, so every layer can read it (pyproject.toml's
`catalog-alone` contract). `serving/errors.py` takes the statuses from here; the dialects' own statuses and
types (OpenAI's, Anthropic's) are mapped in api/.

`docs_url(type, code)` is the catalog entry's address: the process's base (`--error-docs-url`, set once when the
app is built) and the entry's anchor. By default the base is `DOCS_PATH`, the page where the server serves this
catalog itself (api/routes/error_docs.py): a reference relative to the server that answered, so it resolves on
any host, and behind a proxy that keeps the paths.
"""

from __future__ import annotations

from collections.abc import Mapping

from sluicegate.errorcatalog import codes, invalid_request, types
from sluicegate.errorcatalog.entry import ErrorEntry

DOCS_PATH = "/docs/errors"  # GET: the catalog as a page, each entry's `id` its anchor (the route registry's entry)
DEFAULT_DOCS_URL = DOCS_PATH

TYPES: Mapping[str, ErrorEntry] = {e.type: e for e in types.ENTRIES}
CODES: Mapping[tuple[str, str], ErrorEntry] = {
    (e.type, e.code): e for e in (*codes.ENTRIES, *invalid_request.ENTRIES) if e.code is not None}
STATUS: Mapping[str, int] = {t: e.status for t, e in TYPES.items()}

# every entry as docs/errors.md lists it: each type (in its order), then its codes alphabetically
ENTRIES: tuple[ErrorEntry, ...] = tuple(
    e for t in TYPES.values() for e in (t, *sorted((c for c in CODES.values() if c.type == t.type),
                                                   key=lambda c: c.code or "")))


def entry(type_: str, code: str | None) -> ErrorEntry:
    """The entry for an error: its code's, else its type's (no code, or one equal to its type, is the type's)."""
    found = CODES.get((type_, code)) if code is not None else None
    return found if found is not None else TYPES[type_]


_docs_base = DEFAULT_DOCS_URL  # one process, one base: create_app sets it from the settings


def set_docs_base(url: str) -> None:
    """Where the catalog is published (an http(s) URL, or a path on this server; no anchor), for every envelope
    after.

    Process-wide rather than passed along: envelopes are written from a few dozen places (middleware, routes,
    the connection layer, the batch worker) that share no request object, and one server runs one app."""
    global _docs_base
    _docs_base = url


def docs_url(type_: str, code: str | None) -> str:
    """The address of this error's entry in the catalog."""
    return f"{_docs_base}#{entry(type_, code).anchor}"


__all__ = ["CODES", "DEFAULT_DOCS_URL", "DOCS_PATH", "ENTRIES", "STATUS", "TYPES", "ErrorEntry", "docs_url", "entry",
           "set_docs_base"]
