"""Request context (pure ASGI): request id, arrival stamp, Server-Timing and the access log line.

A caller's `X-Request-Id` is kept when it is 1-128 characters of letters, digits, '.', '_', ':' and '-';
otherwise one is generated. The id is in every response header and every error body.
"""

from __future__ import annotations

import logging
import re
import secrets
import time

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from sluicegate.api.envelope import INTERNAL, send_error
from sluicegate.serving.context import RequestContext
from sluicegate.serving.errors import ApiError

log = logging.getLogger("sluicegate.access")
_VALID_ID = re.compile(rb"^[A-Za-z0-9._:-]{1,128}$")


def new_request_id() -> str:
    return "req_" + secrets.token_hex(12)


def context_of(scope: Scope) -> RequestContext:
    ctx = scope.get("state", {}).get("ctx")
    if ctx is None:  # reached without the middleware (tests of a bare router)
        ctx = RequestContext(new_request_id())
        scope.setdefault("state", {})["ctx"] = ctx
    assert isinstance(ctx, RequestContext)
    return ctx


class RequestContextMiddleware:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        arrival = time.monotonic()
        start = time.perf_counter()
        supplied = dict(scope["headers"]).get(b"x-request-id", b"")
        request_id = supplied.decode() if _VALID_ID.match(supplied) else new_request_id()
        ctx = RequestContext(request_id, arrival=arrival)
        scope.setdefault("state", {})["ctx"] = ctx
        status = 0

        async def send_with_headers(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                total = (time.perf_counter() - start) * 1e3
                stages = [f"{name};dur={ms:.3f}" for name, ms in ctx.stages_ms.items()]
                timing = ", ".join([*stages, f"total;dur={total:.3f}"])
                headers = [(k, v) for k, v in message.get("headers", []) if k.lower() != b"x-request-id"]
                headers += [(b"x-request-id", request_id.encode()), (b"server-timing", timing.encode())]
                message = {**message, "headers": headers}
            await send(message)

        try:
            await self.app(scope, receive, send_with_headers)
        except Exception:
            log.exception("%s internal error", request_id)
            if status == 0:  # nothing sent yet: the client still gets the envelope, without the detail
                await send_error(send_with_headers, ApiError("internal_error", INTERNAL), request_id)
            else:
                raise
        finally:
            log.info(
                "%s %s %s %d %.1fms", request_id, scope.get("method", ""), scope.get("path", ""), status,
                (time.perf_counter() - start) * 1e3,
            )
