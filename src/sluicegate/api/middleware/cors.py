"""CORS for browser apps on other origins (`serve --cors-origin`; none by default, so browsers refuse them).

Starlette's middleware, with what an API called from a page needs: the methods the routes use, any request
header (the official SDKs send their own `x-stainless-*` headers; a key is a header, not a cookie, so no
credentials mode), and the response headers a client reads exposed (the request id, the rate-limit headers,
Retry-After, Server-Timing, Idempotent-Replayed). It sits outside auth, so a preflight needs no key and a 401
still carries `Access-Control-Allow-Origin` (the page can read why). A preflight it refuses is answered with
the error envelope (400 `cors_refused`, naming what was refused), not Starlette's plain text.
"""

from __future__ import annotations

from collections.abc import Sequence

from starlette.datastructures import Headers
from starlette.middleware.cors import CORSMiddleware
from starlette.types import ASGIApp, Receive, Scope, Send

from sluicegate.api.envelope import send_error
from sluicegate.api.middleware.request_context import context_of
from sluicegate.serving.errors import ApiError

METHODS = ("GET", "POST", "PATCH", "DELETE", "OPTIONS")
EXPOSED = ("x-request-id", "server-timing", "retry-after", "retry-after-ms", "idempotent-replayed",
           "x-should-retry", "x-ratelimit-limit-tokens", "x-ratelimit-remaining-tokens", "x-ratelimit-reset",
           "x-ratelimit-reset-tokens", "x-ratelimit-limit-requests", "x-ratelimit-remaining-requests",
           "x-ratelimit-reset-requests", "location")


class Cors(CORSMiddleware):
    def __init__(self, app: ASGIApp, origins: Sequence[str]) -> None:
        super().__init__(app, allow_origins=list(origins), allow_methods=METHODS, allow_headers=["*"],
                         expose_headers=EXPOSED, allow_credentials=False, max_age=600)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] == "OPTIONS":
            headers = Headers(scope=scope)
            if "origin" in headers and "access-control-request-method" in headers:
                answer = self.preflight_response(request_headers=headers)
                if answer.status_code == 400:
                    what = bytes(answer.body).decode().removeprefix("Disallowed CORS ")
                    await send_error(send, ApiError("cors_refused", f"this server does not allow the requested "
                                                    f"{what} across origins (serve --cors-origin)", code="cors"),
                                     context_of(scope).request_id)
                    return
                await answer(scope, receive, send)
                return
        await super().__call__(scope, receive, send)


__all__ = ["EXPOSED", "METHODS", "Cors"]
