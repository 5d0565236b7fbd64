"""Cross-site writes (pure ASGI): a write that a web page of another origin sent is refused with 403.

Why: a server on 127.0.0.1 without keys (the default) is reachable from every page the machine's browser opens.
CORS stops such a page from *reading* answers, and a JSON body makes the browser ask first (a preflight this
server refuses unless `--cors-origin` allows the origin), but a "simple" request needs no preflight: a
`multipart/form-data` upload to `/v1/files` from any page would be sent and served, filling the upload quota.
So, as Jupyter and local development servers guard loopback, every write (POST, PUT, PATCH, DELETE) is judged by
what the browser says about where it came from:

- `Origin` present: it must be this server's own origin (its host and port equal the `Host` header's) or one
  `--cors-origin` allows (`*` allows every origin); `Origin: null` (a sandboxed frame, a file) never is.
- no `Origin`: `Sec-Fetch-Site: cross-site` or `same-site` is refused (`same-site` is another port or
  subdomain: another origin), `same-origin`, `none` (typed by the user) and no header pass.

Clients that are not browsers (the SDKs, curl) send neither header and are never affected; the playground page
is same-origin. It applies whether or not the server holds keys: with keys a cross-site page has no key to
send (a key is a header, never a cookie), so the guard costs nothing there and closes the keyless case. It sits
inside the trusted-host check (the Host it compares with is one this server serves) and outside auth.
"""

from __future__ import annotations

from collections.abc import Sequence
from urllib.parse import urlsplit

from starlette.types import ASGIApp, Receive, Scope, Send

from sluicegate.api.envelope import send_error
from sluicegate.api.middleware.request_context import context_of
from sluicegate.hostnames import normal_host
from sluicegate.serving.errors import ApiError

WRITES = frozenset({"POST", "PUT", "PATCH", "DELETE"})
_DEFAULT_PORT = {"http": 80, "https": 443}


def _host_port(text: str, default: int) -> tuple[str | None, int | None]:
    """(host, port) of a `Host` header value or an origin's netloc; (None, None) when it is neither."""
    try:
        parts = urlsplit("//" + text)
        return normal_host(parts.hostname or ""), parts.port or default
    except ValueError:
        return None, None


def same_origin(origin: str, host: str | None) -> bool:
    """Whether `origin` (`scheme://host[:port]`) names the server the `Host` header addresses. The scheme is not
    compared: behind a TLS proxy the server sees http where the page was https."""
    try:
        parts = urlsplit(origin)
    except ValueError:
        return False
    if parts.scheme not in _DEFAULT_PORT or host is None or parts.path or parts.query:
        return False
    theirs = _host_port(parts.netloc, _DEFAULT_PORT[parts.scheme])
    ours = _host_port(host, _DEFAULT_PORT[parts.scheme])
    return theirs[0] is not None and theirs == ours


def cross_site() -> ApiError:
    return ApiError("permission_denied", "a web page of another origin may not write here; call from this "
                    "server's own origin, or have the operator allow that origin (--cors-origin)",
                    param="Origin", code="cross_site")


class CrossSiteWriteMiddleware:
    def __init__(self, app: ASGIApp, allowed_origins: Sequence[str] = ()) -> None:
        self.app = app
        self.any_origin = "*" in allowed_origins
        self.allowed = frozenset(o.lower() for o in allowed_origins)

    def refuses(self, scope: Scope) -> bool:
        if scope["type"] != "http" or scope["method"] not in WRITES or self.any_origin:
            return False
        origins, hosts, sites = [], [], []
        for name, value in scope["headers"]:
            if name == b"origin":
                origins.append(value.decode("latin-1").strip())
            elif name == b"host":
                hosts.append(value.decode("latin-1").strip())
            elif name == b"sec-fetch-site":
                sites.append(value.decode("latin-1").strip().lower())
        if origins:
            if len(origins) > 1:
                return True
            origin = origins[0].rstrip("/").lower()
            return origin not in self.allowed and not same_origin(origin, hosts[0] if len(hosts) == 1 else None)
        return any(site in ("cross-site", "same-site") for site in sites)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self.refuses(scope):
            await send_error(send, cross_site(), context_of(scope).request_id)
            return
        await self.app(scope, receive, send)


__all__ = ["WRITES", "CrossSiteWriteMiddleware", "same_origin"]
