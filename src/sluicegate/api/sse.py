"""Server-sent events: `data:` framing, heartbeat comments, the typed error event, and the final `[DONE]`.

- Each item is one `data: <json>` event, serialised with `exclude_unset` (a delta carries only what it sets).
- When nothing has been sent for `HEARTBEAT_S` seconds (a long queue or prefill), a `: keep-alive` comment
  goes out: SSE parsers ignore it, proxies see traffic, and a gone client is noticed on the write.
- If the producer fails mid-stream, an `event: error` with the envelope as `data` is sent (the `openai`
  client raises APIError on it), then `data: [DONE]`. `[DONE]` is always the last event.
- When the client disconnects, Starlette cancels the response; the pending read is cancelled (or, if the
  generator was between events, `SSEResponse` closes it), which closes the producer, whose runs abort their
  engine requests (`AsyncEngine.stream`'s `finally`) within a step.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any

from fastapi.responses import StreamingResponse
from pydantic import BaseModel
from starlette.types import Receive, Scope, Send

from sluicegate.api.envelope import INTERNAL
from sluicegate.serving.errors import ApiError

log = logging.getLogger("sluicegate.sse")

HEARTBEAT_S = 15.0
DONE = b"data: [DONE]\n\n"
HEARTBEAT = b": keep-alive\n\n"
HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


def frame(data: str, event: str | None = None) -> bytes:
    head = f"event: {event}\n" if event else ""
    return f"{head}data: {data}\n\n".encode()


async def sse_stream(
    items: AsyncIterator[BaseModel],
    *,
    request_id: str,
    render_error: Callable[[ApiError, str], dict[str, Any]],
    heartbeat_s: float | None = None,
) -> AsyncIterator[bytes]:
    interval = HEARTBEAT_S if heartbeat_s is None else heartbeat_s
    pending: asyncio.Future[BaseModel] | None = None
    try:
        while True:
            if pending is None:
                pending = asyncio.ensure_future(anext(items))
            done, _ = await asyncio.wait({pending}, timeout=interval)
            if not done:
                yield HEARTBEAT
                continue
            task, pending = pending, None
            try:
                item = task.result()
            except StopAsyncIteration:
                break
            except ApiError as exc:
                yield frame(json.dumps(render_error(exc, request_id)), event="error")
                break
            except Exception:
                log.exception("%s stream failed", request_id)
                yield frame(
                    json.dumps(render_error(ApiError("internal_error", INTERNAL), request_id)), event="error"
                )
                break
            yield frame(item.model_dump_json(exclude_unset=True))
        yield DONE
    finally:
        if pending is not None:
            pending.cancel()
        else:
            aclose = getattr(items, "aclose", None)
            if aclose is not None:
                await aclose()


class SSEResponse(StreamingResponse):
    """A StreamingResponse that closes its event generator as soon as the response ends.

    When the client disconnects, Starlette cancels the send loop; if that happened while the generator was
    suspended at a `yield`, nothing closes it until garbage collection (a second or more later). Closing it
    here runs its `finally` at once, and with it the engine aborts.
    """

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            aclose = getattr(self.body_iterator, "aclose", None)
            if aclose is not None:
                await aclose()


def sse_response(
    items: AsyncIterator[BaseModel],
    *,
    request_id: str,
    render_error: Callable[[ApiError, str], dict[str, Any]],
) -> StreamingResponse:
    return SSEResponse(
        sse_stream(items, request_id=request_id, render_error=render_error),
        media_type="text/event-stream",
        headers=HEADERS,
    )
