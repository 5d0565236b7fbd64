"""What the connection layer answers, as envelope errors and as the raw bytes of a whole response.

Written straight to the transport, not through the app: the request never became one (its head was too big,
too slow, or not HTTP), or the app is still waiting on its body.
"""

from __future__ import annotations

import json

from uvicorn.protocols.http.httptools_impl import STATUS_LINE, RequestResponseCycle

from sluicegate.api.envelope import INTERNAL, envelope
from sluicegate.api.middleware.request_context import request_id_from
from sluicegate.serving.errors import ApiError


def header_bytes_over(limit: int) -> ApiError:
    return ApiError("headers_too_large", f"the request line and headers are over the limit of {limit} bytes",
                    code="header_bytes")


def header_count_over(limit: int) -> ApiError:
    return ApiError("headers_too_large", f"the request has more than {limit} header fields", code="header_count")


def unsupported_coding() -> ApiError:
    return ApiError("unsupported_transfer_encoding", "only Transfer-Encoding: chunked is understood; send the body "
                    "with Content-Length or chunked, without other codings", param="Transfer-Encoding",
                    code="transfer_coding")


def too_many_connections(limit: int) -> ApiError:
    return ApiError("overloaded", f"the server holds its limit of {limit} connections; retry shortly",
                    code="too_many_connections", retry_after=1)


def timed_out(head: bool, wait: float) -> ApiError:
    if head:
        return ApiError("request_timeout", f"the request's headers did not arrive within {wait:g} s",
                        code="header_timeout")
    return ApiError("request_timeout", f"the request body stalled: nothing arrived for {wait:g} s",
                    code="body_timeout")


def malformed(reason: str) -> ApiError:
    return ApiError("malformed_http", f"the request is not valid HTTP/1.1 ({reason})", code="malformed_http")


def response_bytes(error: ApiError, request_id: str, default_headers: list[tuple[bytes, bytes]]) -> bytes:
    """The whole response: status line, the server's default headers (date, server), the envelope as JSON,
    `X-Request-Id`, `Retry-After` when the error has one, and `Connection: close`."""
    body = json.dumps(envelope(error, request_id)).encode()
    head = [STATUS_LINE[error.status]]
    for name, value in default_headers:
        head += [name, b": ", value, b"\r\n"]
    head += [b"content-type: application/json\r\ncontent-length: ", str(len(body)).encode(),
             b"\r\nx-request-id: ", request_id.encode(), b"\r\nconnection: close\r\n"]
    if error.retry_after is not None:
        head += [b"retry-after: ", str(error.retry_after).encode(), b"\r\n"]
    return b"".join([*head, b"\r\n", body])


class EnvelopeCycle(RequestResponseCycle):
    """uvicorn's request cycle, whose own 500 (an app that ended without answering, or raised before it did)
    is the envelope too. The protocol sets it as each cycle's class: the rest of the cycle is uvicorn's."""

    async def send_500_response(self) -> None:
        ctx = self.scope["state"].get("ctx")
        request_id = ctx.request_id if ctx is not None else request_id_from(list(self.scope["headers"]))
        body = json.dumps(envelope(ApiError("internal_error", INTERNAL), request_id)).encode()
        await self.send({"type": "http.response.start", "status": 500, "headers": [
            (b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
            (b"x-request-id", request_id.encode()), (b"connection", b"close")]})
        await self.send({"type": "http.response.body", "body": body, "more_body": False})
