"""`GET /` and `GET /playground`: a small page, shipped in the package, to try the server in a browser.

Plain HTML, CSS and JavaScript modules under `sluicegate/api/playground/` (no build step, no third-party
asset, nothing fetched from elsewhere), served with a strict Content-Security-Policy: scripts and styles from
this origin only (no inline ones), requests to this origin only, no framing. The page holds no data: it
calls the same API any client calls, with the key the user types (kept in the tab's sessionStorage), so
these routes need no key (api/middleware/auth.py). Only the files in `ASSETS` are served; any other name
is 404, and no path reaches the file system.
"""

from __future__ import annotations

import hashlib
from functools import cache
from importlib import resources

from fastapi import APIRouter, Request
from fastapi.responses import Response

from sluicegate.serving.errors import ApiError

router = APIRouter(tags=["operations"])

PREFIX = "/playground/assets"
CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self' blob:; "
       "base-uri 'none'; form-action 'none'; frame-ancestors 'none'")
TYPES = {".js": "text/javascript; charset=utf-8", ".css": "text/css; charset=utf-8",
         ".svg": "image/svg+xml", ".html": "text/html; charset=utf-8"}
ASSETS = ("app.js", "api.js", "chat.js", "inspect.js", "batches.js", "plots.js", "style.css", "icon.svg")
# Revalidated on each load (an upgraded server never runs yesterday's script); the ETag makes that a 304.
HEADERS = {"Content-Security-Policy": CSP, "X-Content-Type-Options": "nosniff", "Referrer-Policy": "no-referrer",
           "Cache-Control": "no-cache"}


@cache
def _read(name: str) -> tuple[bytes, str]:
    body = resources.files("sluicegate.api").joinpath("playground", name).read_bytes()
    return body, '"' + hashlib.sha256(body).hexdigest()[:32] + '"'


def _file(request: Request, name: str) -> Response:
    body, etag = _read(name)
    headers = {**HEADERS, "ETag": etag}
    if etag in request.headers.get("if-none-match", ""):
        return Response(status_code=304, headers=headers)
    return Response(body, media_type=TYPES[name[name.rfind("."):]], headers=headers)


@router.get("/", include_in_schema=False)
@router.get("/playground", include_in_schema=False)
async def page(request: Request) -> Response:
    return _file(request, "index.html")


@router.get(PREFIX + "/{name}", include_in_schema=False)
async def asset(request: Request, name: str) -> Response:
    if name not in ASSETS:
        raise ApiError("not_found", "no such playground asset", code="asset_not_found")
    return _file(request, name)
