"""The caller's time budget (pure ASGI): every route that creates work gets its deadlines here, in one place.

The headers (`X-Request-Timeout`, else the official SDKs' `x-stainless-read-timeout` / `x-stainless-timeout`)
become `RequestContext.deadlines` and `RequestContext.deadline` (a whole answer's); the serving core switches
to a stream's when the request streams (serving/deadline.py has the rules, docs/timeouts.md the why). A
malformed value is refused here, before the body is read, in the envelope of the route's surface: 422
`invalid_request` on native routes, 400 `invalid_request_error` on the OpenAI-compatible ones, `param`
naming the header. Other routes (reads, health, metrics) ignore the headers: they create no work. Which
routes read them, and their error dialect: the route registry (`deadline`, `dialect`; sluicegate/registry.py).
"""

from __future__ import annotations

from collections.abc import Mapping

from starlette.types import ASGIApp, Receive, Scope, Send

from sluicegate.api.dialects import RENDERING
from sluicegate.api.middleware.request_context import context_of
from sluicegate.config import DeadlineConfig
from sluicegate.registry import ROUTES, Dialect
from sluicegate.serving import deadline
from sluicegate.serving.errors import ApiError

# the POST routes that read the headers -> their errors' dialect (written as api/dialects.py maps it; Anthropic's:
# the envelope, which api/anthropic_errors.py re-renders)
_DIALECTS: Mapping[str, Dialect] = {r.path: r.dialect for r in ROUTES if r.deadline}
_NAMES = frozenset(key.encode() for key, _, _ in deadline.HEADERS)


class DeadlineMiddleware:
    def __init__(self, app: ASGIApp, config: DeadlineConfig) -> None:
        self.app = app
        self.config = config

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        dialect = _DIALECTS.get(scope.get("path", "")) if scope["type"] == "http" else None
        if dialect is None or scope.get("method") != "POST":
            await self.app(scope, receive, send)
            return
        ctx = context_of(scope)
        sent: dict[str, list[str]] = {}
        for name, value in scope["headers"]:
            if name.lower() in _NAMES:
                sent.setdefault(name.lower().decode(), []).append(value.decode("latin-1"))
        try:
            deadline.apply(ctx, deadline.caller_timeout(sent), self.config)
        except ApiError as exc:
            await RENDERING[dialect].render(exc, ctx.request_id)(scope, receive, send)
            return
        await self.app(scope, receive, send)
