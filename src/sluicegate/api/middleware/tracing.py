"""The server span of each request (pure ASGI), just inside the request context: it has the request id.

A W3C `traceparent` (and `tracestate`) from the caller becomes the parent; with tracing off that context is
still made current, so an upstream engine is sent the caller's trace as it came (telemetry/tracing.py). The
span is named after the route's template (`POST /v1/batches/{batch_id}`: a bounded set of names), and carries
the method, path, status, request id and, once auth has run, the key's id.
"""

from __future__ import annotations

from starlette.types import ASGIApp, Receive, Scope, Send

from sluicegate.api.middleware.request_context import StatusWatch, context_of
from sluicegate.telemetry import tracing

_PROPAGATED = (b"traceparent", b"tracestate")


class TracingMiddleware:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        from opentelemetry import context as otel_context
        from opentelemetry.propagate import extract

        carrier = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"] if k in _PROPAGATED}
        token = otel_context.attach(extract(carrier)) if carrier else None
        try:
            if not tracing.enabled():
                await self.app(scope, receive, send)
                return
            await self._traced(scope, receive, send)
        finally:
            if token is not None:
                otel_context.detach(token)

    async def _traced(self, scope: Scope, receive: Receive, send: Send) -> None:
        from opentelemetry.trace import SpanKind, Status, StatusCode

        ctx = context_of(scope)
        method = scope.get("method", "")
        watch = StatusWatch(send)
        attributes = {"http.request.method": method, "url.path": scope.get("path", ""),
                      tracing.REQUEST_ID: ctx.request_id}
        with tracing.tracer().start_as_current_span(method, kind=SpanKind.SERVER, attributes=attributes) as span:
            try:
                await self.app(scope, receive, watch)
            finally:
                status = watch.status
                route = getattr(scope.get("route"), "path", None)
                if route:
                    span.update_name(f"{method} {route}")
                    span.set_attribute("http.route", route)
                if status:
                    span.set_attribute("http.response.status_code", status)
                if ctx.key_id:
                    span.set_attribute("sluicegate.key_id", ctx.key_id)
                if status >= 500:
                    span.set_status(Status(StatusCode.ERROR))


__all__ = ["TracingMiddleware"]
