"""Server-sent events: `data:` framing, heartbeat comments, the typed error event, and the final `[DONE]`.

- Each item is one `data: <json>` event, serialised with `exclude_unset` (a delta carries only what it sets);
  an item that is a str is that JSON already serialised (the producer's fast path for plain text deltas).
- A `None` item is the producer's heartbeat cue (serving/core.py: nothing for `HEARTBEAT_S` seconds, a long
  queue or prefill): a `: keep-alive` comment goes out; SSE parsers ignore it, proxies see traffic, and a
  gone client is noticed on the write. The producer owns the timer, so no task is created per event.
- If the producer fails mid-stream, an `event: error` with the envelope as `data` is sent (the `openai`
  client raises APIError on it), then `data: [DONE]`. `[DONE]` is always the last event.
- When the client disconnects, Starlette cancels the response; the cancellation reaches the producer's
  pending wait, whose `finally` aborts its engine runs within a step. `SSEResponse` also closes the producer
  (and calls `on_close`) when the response ends, so runs end even if the producer never started.
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

from fastapi.responses import StreamingResponse
from pydantic import BaseModel
from starlette.types import Receive, Scope, Send

from sluicegate.api.envelope import INTERNAL
from sluicegate.refusal import Rejected
from sluicegate.serving.errors import ApiError

log = logging.getLogger("sluicegate.sse")

DONE = b"data: [DONE]\n\n"
HEARTBEAT = b": keep-alive\n\n"
HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


def frame(data: str, event: str | None = None) -> bytes:
    head = f"event: {event}\n" if event else ""
    return f"{head}data: {data}\n\n".encode()


@dataclass(frozen=True, slots=True)
class Framing:
    """How a surface's events go on the wire. OpenAI's (the default): unnamed `data:` events serialised with
    `exclude_unset`, a comment as the heartbeat, `[DONE]` last. Anthropic's: each event named after its
    `type` and serialised whole, `ping` as the heartbeat, `message_stop` last."""

    named: bool = False
    last: bytes = DONE  # sent after everything, an error event included; held back until the work has ended
    heartbeat: bytes = HEARTBEAT

    def event(self, item: BaseModel | str) -> bytes:
        if isinstance(item, str):
            return frame(item)
        if self.named:
            return frame(item.model_dump_json(), event=str(getattr(item, "type", "message")))
        return frame(item.model_dump_json(exclude_unset=True))


OPENAI_FRAMING = Framing()
ANTHROPIC_FRAMING = Framing(
    named=True, last=frame('{"type": "message_stop"}', "message_stop"), heartbeat=frame('{"type": "ping"}', "ping")
)


async def sse_stream(
    items: AsyncIterator[BaseModel | str | None],
    *,
    request_id: str,
    render_error: Callable[[Rejected, str], dict[str, Any]],
    framing: Framing = OPENAI_FRAMING,
) -> AsyncIterator[bytes]:
    try:
        try:
            async for item in items:
                yield framing.heartbeat if item is None else framing.event(item)
        except Rejected as exc:
            yield frame(json.dumps(render_error(exc, request_id)), event="error")
        except Exception:
            log.exception("%s stream failed", request_id)
            yield frame(json.dumps(render_error(ApiError("internal_error", INTERNAL), request_id)), event="error")
        yield framing.last
    finally:
        aclose = getattr(items, "aclose", None)
        if aclose is not None:
            await aclose()


class SSEResponse(StreamingResponse):
    """A StreamingResponse that closes its event generator as soon as the response ends.

    When the client disconnects, Starlette cancels the send loop; if that happened while the generator was
    suspended at a `yield`, nothing closes it until garbage collection (a second or more later). Closing it
    here runs its `finally` at once, and with it the engine aborts.
    """

    def __init__(self, content: AsyncIterator[bytes], *, on_close: Callable[[], None] | None = None,
                 **kwargs: Any) -> None:
        super().__init__(content, **kwargs)
        self._on_close = on_close

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            aclose = getattr(self.body_iterator, "aclose", None)
            if aclose is not None:
                await aclose()
            if self._on_close is not None:
                self._on_close()


def sse_response(
    items: AsyncIterator[BaseModel | str | None],
    *,
    request_id: str,
    render_error: Callable[[Rejected, str], dict[str, Any]],
    on_close: Callable[[], None] | None = None,
    framing: Framing = OPENAI_FRAMING,
) -> StreamingResponse:
    return SSEResponse(
        sse_stream(items, request_id=request_id, render_error=render_error, framing=framing),
        on_close=on_close,
        media_type="text/event-stream",
        headers=HEADERS,
    )
