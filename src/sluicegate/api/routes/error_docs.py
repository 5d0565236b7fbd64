"""`GET /docs/errors`: the error catalog as a page, where every envelope's `docs_url` points by default.

Rendered from the catalog (src/sluicegate/errorcatalog/) by the code that writes docs/errors.md's table
(contract/errors_doc.py, `page`), once per process: each entry's `id` is the anchor `docs_url` ends with, so
the server that sent an error documents exactly the codes it sends. Public like /healthz (the route registry):
the page holds no data, and a caller refused for its key can still read why.
"""

from __future__ import annotations

from functools import cache

from fastapi import APIRouter
from fastapi.responses import HTMLResponse

from sluicegate.contract.errors_doc import page
from sluicegate.errorcatalog import DOCS_PATH

router = APIRouter(tags=["operations"])

# no script, style or frame: the page is text and links to its own anchors
HEADERS = {"Cache-Control": "public, max-age=3600", "X-Content-Type-Options": "nosniff",
           "Content-Security-Policy": "default-src 'none'; base-uri 'none'; form-action 'none'; "
                                      "frame-ancestors 'none'"}


@cache
def _page() -> bytes:
    return page().encode()


@router.get(DOCS_PATH, include_in_schema=False)
async def error_catalog() -> HTMLResponse:
    return HTMLResponse(_page(), headers=HEADERS)
