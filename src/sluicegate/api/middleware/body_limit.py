"""Body limit (pure ASGI): a body over `max_bytes` is refused with 413 without the server holding it.

- Declared: a Content-Length over the limit is answered at once, before a byte of the body is read.
- Counted: a body without one (chunked) is counted as the app receives it; the message that crosses the
  limit is never handed to the app, so the app holds at most `max_bytes`. Receiving raises `BodyTooLarge`
  (an HTTPException, so FastAPI's own body reading re-raises it); the app's handler renders the envelope,
  or, if it escapes the app, this middleware does.
- Drained, not reset: a client still sending when the server answers would get a connection reset (a socket
  closed with unread data answers with RST) and usually lose the 413 in it. So the 413 goes out whole, with
  `Connection: close`, while the response is held open; what the client still sends is read and discarded,
  up to `drain_bytes` and `drain_s`; then the response ends and the server closes a clean connection. Past
  those bounds it closes under the client: the bound on what one abusive request may cost.
  A client that sent `Expect: 100-continue` was never told to send the body, so it is not waited for.
"""

from __future__ import annotations

import asyncio
import logging
import time

from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from sluicegate.api.envelope import send_error
from sluicegate.api.middleware.request_context import context_of
from sluicegate.config import LimitsConfig
from sluicegate.registry import ROUTES, Upload
from sluicegate.serving.errors import ApiError

log = logging.getLogger("sluicegate.access")

DRAIN_BYTES = 128 << 20  # at most this much of a refused body is read and discarded
DRAIN_S = 10.0  # for at most this long


class BodyTooLarge(HTTPException):
    """Raised from `receive` when the counted body passes the limit."""

    def __init__(self, limit: int, received: int) -> None:
        super().__init__(413, "body too large")
        self.limit = limit
        self.received = received

    def api_error(self) -> ApiError:
        return too_large(self.limit, f"more than {self.limit} bytes were sent")


def too_large(limit: int, what: str) -> ApiError:
    return ApiError(
        "body_too_large", f"the request body is over the limit of {limit} bytes ({what})",
        code="body_too_large", headers={"Connection": "close"},
    )


def _declared_length(scope: Scope) -> int | None:
    for key, value in scope["headers"]:
        if key == b"content-length":
            return int(value) if value.isdigit() else None
    return None


def _expects_continue(scope: Scope) -> bool:
    return any(k == b"expect" and v.lower() == b"100-continue" for k, v in scope["headers"])


UPLOAD_OVERHEAD = 64 << 10  # multipart framing and form fields allowed beside an upload's own limit
JSONL_TYPES = (b"application/jsonl", b"application/x-ndjson", b"application/jsonlines")
_UPLOADS = {r.path: r.upload for r in ROUTES if r.upload is not None}


def upload_limit(scope: Scope, file_bytes: int) -> int | None:
    """The upload routes' own limit (the route registry's `upload`), exempt from the JSON one: a multipart file
    (`/v1/files`), a JSONL body (`/v1/batch-predictions`), both streamed to the store; the routes count the
    file itself. None: a JSON route, or a JSON body, under the JSON limit."""
    if scope.get("method") != "POST":
        return None
    upload = _UPLOADS.get(scope.get("path", ""))
    if upload is Upload.FILE:
        return file_bytes + UPLOAD_OVERHEAD
    if upload is Upload.JSONL:
        for key, value in scope["headers"]:
            if key == b"content-type" and value.partition(b";")[0].strip().lower() in JSONL_TYPES:
                return file_bytes
    return None


class BodyLimitMiddleware:
    def __init__(
        self, app: ASGIApp, max_bytes: int = LimitsConfig().max_body_bytes, *, drain_bytes: int = DRAIN_BYTES,
        drain_s: float = DRAIN_S, upload_bytes: int | None = None,
    ) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.upload_bytes = upload_bytes  # None: no route is exempt
        self.drain_bytes = drain_bytes
        self.drain_s = drain_s

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        upload = None if self.upload_bytes is None else upload_limit(scope, self.upload_bytes)
        max_bytes = self.max_bytes if upload is None else upload
        declared = _declared_length(scope)
        if declared is not None and declared > max_bytes:
            err = too_large(max_bytes, f"Content-Length is {declared}")
            await self._refuse(scope, receive, send, err, 0, drain=not _expects_continue(scope))
            return

        received = 0
        tripped = False
        body_done = False  # the client has sent all of its body: nothing is left to drain
        started = ended = False

        async def counted() -> Message:
            nonlocal received, tripped, body_done
            if tripped:  # asked again after the refusal: the rest is not the app's to read
                raise BodyTooLarge(max_bytes, received)
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                body_done = not message.get("more_body", False)
                if received > max_bytes:
                    tripped = True
                    raise BodyTooLarge(max_bytes, received)
            return message

        async def send_then_drain(message: Message) -> None:
            nonlocal started, ended
            if not tripped:
                started = started or message["type"] == "http.response.start"
                await send(message)
                return
            if message["type"] == "http.response.start":  # the app's own answer to the refusal
                started = True
                headers = [(k, v) for k, v in message.get("headers", []) if k.lower() != b"connection"]
                message = {**message, "headers": [*headers, (b"connection", b"close")]}
            elif message["type"] == "http.response.body" and not message.get("more_body", False):
                await send({**message, "more_body": True})
                if not body_done:
                    await self._drain(scope, receive, received)
                message = {"type": "http.response.body", "body": b"", "more_body": False}
                ended = True
            await send(message)

        try:
            await self.app(scope, counted, send_then_drain)
        except BodyTooLarge as exc:
            if started:
                raise
            await self._refuse(scope, receive, send, exc.api_error(), received, drain=not body_done)
            return
        if tripped and not started:  # the app swallowed the refusal and answered nothing
            err = BodyTooLarge(max_bytes, received).api_error()
            await self._refuse(scope, receive, send, err, received, drain=not body_done)
        elif tripped and not ended:  # pragma: no cover - a streamed answer that never ended
            log.warning("%s refused body: the response did not end", context_of(scope).request_id)

    async def _refuse(
        self, scope: Scope, receive: Receive, send: Send, err: ApiError, received: int, *, drain: bool = True,
    ) -> None:
        """The whole 413 first (the client can read it at once), then drain, then end the response."""
        await send_error(send, err, context_of(scope).request_id, final=False)
        if drain:
            await self._drain(scope, receive, received)
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    async def _drain(self, scope: Scope, receive: Receive, already: int) -> None:
        """Read and discard what the client still sends, within the bounds; log what happened."""
        start = time.perf_counter()
        drained = 0
        complete = False
        try:
            async with asyncio.timeout(self.drain_s):
                while drained <= self.drain_bytes:
                    message = await receive()
                    if message["type"] != "http.request":
                        break
                    drained += len(message.get("body", b""))
                    if not message.get("more_body", False):
                        complete = True
                        break
        except TimeoutError:
            pass
        log.info(
            "%s body over %d bytes refused: %d received, %d discarded in %.2fs%s",
            context_of(scope).request_id, self.max_bytes, already, drained, time.perf_counter() - start,
            "" if complete else " (not to the end: closing under the client)",
        )
