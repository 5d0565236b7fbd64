"""The one error envelope, as a response object or as raw ASGI messages (for middleware), and the mapping of
a refusal (sluicegate/refusal.py: no HTTP in it) to its status and headers on the native routes."""

from __future__ import annotations

import json

from fastapi.responses import JSONResponse
from prometheus_client import Counter
from starlette.types import Send

from sluicegate.errorcatalog import STATUS, docs_url
from sluicegate.refusal import Rejected
from sluicegate.serving.errors import ApiError

INTERNAL = "internal error; report the request id"

# Process-wide (the default registry, exported by /metrics beside the engine's): every envelope sent, by type.
ERRORS = Counter("sluicegate_request_errors", "responses and stream error events carrying the error envelope, "
                 "by error type (refusals and failures)", ["type"])


def envelope(exc: Rejected, request_id: str) -> dict[str, dict[str, str | None]]:
    """The body of every error (called once per error sent, so it counts them). `docs_url` is the catalog's
    entry for its type and code (docs/errors.md), whatever dialect renders it after."""
    ERRORS.labels(exc.type).inc()
    return {
        "error": {
            "type": exc.type, "code": exc.code, "message": exc.message, "param": exc.param,
            "request_id": request_id, "docs_url": docs_url(exc.type, exc.code),
        }
    }


def http_status(exc: Rejected) -> int:
    """The status of a refusal on the native routes: its type's, from the error catalog."""
    return STATUS[exc.type]


def http_headers(exc: Rejected) -> dict[str, str]:
    """The response headers of a refusal: the serving layer's own (an ApiError's), and its retry hint."""
    headers = dict(exc.headers) if isinstance(exc, ApiError) else {}
    if exc.retry_after is not None:
        headers["Retry-After"] = str(exc.retry_after)
    return headers


def error_response(exc: Rejected, request_id: str) -> JSONResponse:
    return JSONResponse(envelope(exc, request_id), status_code=http_status(exc), headers=http_headers(exc))


async def send_error(send: Send, exc: Rejected, request_id: str, *, final: bool = True) -> None:
    """Send an error response from pure ASGI code.

    With `final=False` the whole body goes out but the response is left open (`more_body`), so the caller
    can still read what the client sends before it ends the response with an empty body message.
    """
    body = json.dumps(envelope(exc, request_id)).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    headers += [(k.lower().encode(), v.encode()) for k, v in http_headers(exc).items()]
    await send({"type": "http.response.start", "status": http_status(exc), "headers": headers})
    await send({"type": "http.response.body", "body": body, "more_body": not final})
