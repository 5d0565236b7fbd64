"""Errors on Anthropic's routes (`/v1/messages`, `/v1/messages/count_tokens` and any path below them: the route
registry's `Dialect.ANTHROPIC`, sluicegate/registry.py): Anthropic's shape and statuses.

Body: `{"type": "error", "error": {"type", "message", "code", "param", "docs_url"}, "request_id"}`: Anthropic's
fields, plus our specific kind (`code`: our `type`, or for a generic invalid request its `code`, as on the OpenAI
routes), the parameter at fault (`param`) and the catalog entry of our type and code (`docs_url`), which its
clients pass through (their error models allow extra fields; docs/anthropic.md). Statuses, as
Anthropic documents them, so the official `anthropic` client raises its typed exceptions:

| ours | status | Anthropic type |
| --- | --- | --- |
| 400, 422 (invalid input of any kind), 405, 415 | 400 (405, 415 kept) | invalid_request_error |
| 401 | 401 | authentication_error |
| 403 | 403 | permission_error |
| 404 (unknown model or route) | 404 | not_found_error |
| 409 idempotency_key_in_use | 409 | invalid_request_error (the client retries 409) |
| 413 | 413 | request_too_large |
| 429 (rate, concurrency, monthly budget) | 429 | rate_limit_error |
| 503 `overloaded` (queue full, deadline unmeetable) | 529 | overloaded_error |
| other 503 (not ready, shutting down, a store or upstream away) | 503 | overloaded_error |
| 504 (deadline passed) | 504 | timeout_error |
| 500, 502 and any other | kept | api_error |

One middleware (`AnthropicErrors`) renders every error of these routes, whoever raised it (auth, limits,
body limit, deadline, drain, the route), from the one envelope; it also sends the request id as Anthropic's
`request-id` header beside our `X-Request-Id`. A stream's error event is rendered by `anthropic_envelope`.
"""

from __future__ import annotations

import json
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from sluicegate.api.envelope import envelope, http_status
from sluicegate.api.middleware.request_context import context_of
from sluicegate.errorcatalog import STATUS
from sluicegate.refusal import Rejected
from sluicegate.registry import Dialect, route_for

_BY_STATUS = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
              404: "not_found_error", 413: "request_too_large", 429: "rate_limit_error", 503: "overloaded_error",
              504: "timeout_error"}


def anthropic_view(status: int, kind: str) -> tuple[int, str]:
    """(status, Anthropic type) of an error of ours with this status and type."""
    if kind == "overloaded":
        return 529, "overloaded_error"
    if status == 422:
        status = 400
    if status in _BY_STATUS:
        return status, _BY_STATUS[status]
    return status, "invalid_request_error" if status < 500 else "api_error"


def _shape(status: int, error: dict[str, Any], request_id: str) -> tuple[int, dict[str, Any]]:
    kind = str(error.get("type", ""))
    new_status, new_type = anthropic_view(status, kind)
    # our kind: the specific rule for a generic invalid request, else our type (docs/errors.md lists both)
    code = (error.get("code") or kind) if kind == "invalid_request" else (kind if kind in STATUS else error.get("code"))
    body = {"type": "error", "error": {"type": new_type, "message": error.get("message", ""), "code": code,
                                       "param": error.get("param"), "docs_url": error.get("docs_url")},
            "request_id": request_id}
    return new_status, body


def anthropic_envelope(exc: Rejected, request_id: str) -> dict[str, Any]:
    """The body of an error event in a stream (also counts it, as every envelope is)."""
    return _shape(http_status(exc), envelope(exc, request_id)["error"], request_id)[1]


class AnthropicErrors:
    """Pure ASGI, inside the request context and outside everything that can refuse (module doc)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or route_for(scope.get("path", "")).dialect is not Dialect.ANTHROPIC:
            await self.app(scope, receive, send)
            return
        rid = context_of(scope).request_id
        held: Message | None = None  # an error's start, held until its body is in
        body = b""

        async def convert(message: Message) -> None:
            nonlocal held, body
            if message["type"] == "http.response.start":
                headers = [*message.get("headers", []), (b"request-id", rid.encode())]
                content_type = dict(headers).get(b"content-type", b"")
                if message["status"] >= 400 and content_type.startswith(b"application/json"):
                    held = {**message, "headers": headers}
                    return
                await send({**message, "headers": headers})
                return
            if held is None or message["type"] != "http.response.body":
                await send(message)
                return
            body += message.get("body", b"")
            if message.get("more_body", False):
                return
            start, held = held, None
            status, out = start["status"], body
            try:
                parsed = json.loads(body)
            except ValueError:
                parsed = None
            if isinstance(parsed, dict) and isinstance(parsed.get("error"), dict) and parsed.get("type") != "error":
                status, shaped = _shape(status, parsed["error"], rid)
                out = json.dumps(shaped).encode()
            headers = [(k, v) for k, v in start["headers"] if k != b"content-length"]
            headers.append((b"content-length", str(len(out)).encode()))
            await send({**start, "status": status, "headers": headers})
            await send({"type": "http.response.body", "body": out})

        await self.app(scope, receive, convert)


__all__ = ["AnthropicErrors", "anthropic_envelope", "anthropic_view"]
