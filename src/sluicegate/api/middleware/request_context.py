"""Request context (pure ASGI): request id, arrival stamp, Server-Timing and the access log line.

A caller's `X-Request-Id` is kept when it is 1-128 characters of letters, digits, '.', '_', ':' and '-';
otherwise one is generated. The id is in every response header and every error body.

One access line per request, at info: id, method, path, status, time, and how it ended when it did not end
normally; in a JSON log (`--log-format json`) also the route, the key's id, the prompt, cached and completion
tokens, the first run's queue, prefill and decode milliseconds and its finish reason (`access_fields`).
A client that leaves mid-body (Starlette's `ClientDisconnect` from reading the body) is not an
error: its line says so with status 499 (nginx's "client closed request"), and `on_disconnect("body")`
counts it; one that leaves before the answer ended counts as `"answer"`. A request that the connection layer
answered itself (a body timeout: `CLOSED_BY`) logs that status; one cut by the shutdown drain (`CUT`) logs
at warning.
"""

from __future__ import annotations

import logging
import re
import secrets
import time
from collections.abc import Callable

from starlette.requests import ClientDisconnect
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from sluicegate.api.envelope import INTERNAL, send_error
from sluicegate.serving.context import AccessRecord, RequestContext
from sluicegate.serving.errors import STATUS, ApiError
from sluicegate.telemetry.logs import REQUEST_ID

log = logging.getLogger("sluicegate.access")
_VALID_ID = re.compile(rb"^[A-Za-z0-9._:-]{1,128}$")


# Marks in a request's `scope["state"]` set below the app, read by the access line.
CLOSED_BY = "sluicegate.closed_by"  # the connection layer answered this request itself (e.g. a body timeout)
CUT = "sluicegate.cut"  # the shutdown drain ended this request before it finished


def new_request_id() -> str:
    return "req_" + secrets.token_hex(12)


def request_id_from(headers: list[tuple[bytes, bytes]] | None) -> str:
    """The caller's valid `X-Request-Id` among `headers` (lower-case names), else a new one."""
    for name, value in headers or ():
        if name == b"x-request-id":
            return value.decode() if _VALID_ID.match(value) else new_request_id()
    return new_request_id()


def access_fields(scope: Scope, ctx: RequestContext, status: int, total_ms: float,
                  outcome: str | None) -> dict[str, object]:
    """The access line's fields for a JSON log (telemetry/logs.py): who, what, how it ended, what it cost and
    where the time went. Never a header, a body, a prompt or a key (the key's id is public: docs/keys.md)."""
    route = getattr(scope.get("route"), "path", None)
    fields: dict[str, object] = {"event": "access", "method": scope.get("method", ""), "path": scope.get("path", ""),
                                 "route": route, "status": status, "duration_ms": round(total_ms, 1),
                                 "key_id": ctx.key_id}
    usage = ctx.used()
    fields.update(prompt_tokens=usage.prompt_tokens, completion_tokens=usage.generated_tokens,
                  cached_tokens=usage.cached_tokens)
    first = next((f for f in ctx.record.finals if f is not None), None)
    if first is not None and first.finish_reason is not None:
        fields["finish_reason"] = first.finish_reason.value
    if first is not None and first.timing is not None:
        t = first.timing
        fields.update(queue_ms=round(t.queue_ms, 1), prefill_ms=round(t.prefill_ms, 1), decode_ms=round(t.decode_ms, 1))
    if outcome:
        fields["outcome"] = outcome
    return fields


def context_of(scope: Scope) -> RequestContext:
    ctx = scope.get("state", {}).get("ctx")
    if ctx is None:  # reached without the middleware (tests of a bare router)
        ctx = RequestContext(new_request_id())
        scope.setdefault("state", {})["ctx"] = ctx
    assert isinstance(ctx, RequestContext)
    return ctx


class StatusWatch:
    """A `send` that passes every message on and keeps the response's status: 0 until the response starts."""

    def __init__(self, send: Send) -> None:
        self.send = send
        self.status = 0

    async def __call__(self, message: Message) -> None:
        if message["type"] == "http.response.start":
            self.status = message["status"]
        await self.send(message)


class RequestContextMiddleware:
    def __init__(self, app: ASGIApp, on_disconnect: Callable[[str], None] | None = None) -> None:
        self.app = app
        self.on_disconnect = on_disconnect

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        arrival = time.monotonic()
        start = time.perf_counter()
        supplied = dict(scope["headers"]).get(b"x-request-id", b"")
        valid = bool(_VALID_ID.match(supplied))
        request_id = supplied.decode() if valid else new_request_id()
        record = AccessRecord()  # this middleware's: Server-Timing and the access line read it
        ctx = RequestContext(request_id, arrival=arrival, record=record, supplied_id=valid)
        id_token = REQUEST_ID.set(request_id)  # every log line this request causes carries it (telemetry/logs.py)
        state = scope.setdefault("state", {})
        state["ctx"] = ctx
        status = 0
        ended = False
        outcome = ""

        async def send_with_headers(message: Message) -> None:
            nonlocal status, ended
            if message["type"] == "http.response.start":
                status = message["status"]
                total = (time.perf_counter() - start) * 1e3
                stages = [f"{name};dur={ms:.3f}" for name, ms in record.stages_ms.items()]
                timing = ", ".join([*stages, f"total;dur={total:.3f}"])
                headers = [(k, v) for k, v in message.get("headers", []) if k.lower() != b"x-request-id"]
                headers += [(b"x-request-id", request_id.encode()), (b"server-timing", timing.encode())]
                message = {**message, "headers": headers}
            elif not message.get("more_body", False):
                ended = True
            await send(message)

        try:
            await self.app(scope, receive, send_with_headers)
            if status == 499 or (status and not ended):
                outcome = " client left before the answer ended"
                self._count("answer")
        except ClientDisconnect:
            closed_by = state.get(CLOSED_BY)
            if isinstance(closed_by, str):  # the connection layer answered it (a body timeout)
                status, outcome = STATUS[closed_by], f" {closed_by}: answered and closed by the connection layer"
            else:
                status, outcome = 499, " client disconnected mid-body"
                self._count("body")
        except Exception:
            log.exception("%s internal error", request_id)
            if status == 0:  # nothing sent yet: the client still gets the envelope, without the detail
                await send_error(send_with_headers, ApiError("internal_error", INTERNAL), request_id)
            else:
                raise
        finally:
            cut = state.get(CUT)
            total_ms = (time.perf_counter() - start) * 1e3
            log.log(
                logging.WARNING if cut else logging.INFO, "%s %s %s %d %.1fms%s%s", request_id,
                scope.get("method", ""), scope.get("path", ""), status, total_ms,
                outcome, " cut by the shutdown after the drain time" if cut else "",
                extra={"fields": access_fields(scope, ctx, status, total_ms, outcome.strip() or None)},
            )
            REQUEST_ID.reset(id_token)

    def _count(self, stage: str) -> None:
        if self.on_disconnect is not None:
            self.on_disconnect(stage)
