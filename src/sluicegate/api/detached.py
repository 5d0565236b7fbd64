"""Work that outlives its client: a request's answer made in a task of its own, which the response reads.

Requests carrying an Idempotency-Key run this way (api/idempotency.py). Their client may leave (a read
timeout, a dropped connection) and retry with the same key; the work goes on to its end (or its deadline) and
its answer is stored, so the retry gets 409 while it runs and then the stored answer, and the engine generates
once. Without a key, work stays tied to its client (api/disconnect.py, api/sse.py): a client that leaves
cancels it, since nobody could ever read the answer.

- `answer_detached`: a whole answer. A task runs `finish` to its Response (a refusal rendered by `render`);
  the request waits for it while watching the connection. A client that leaves gets nothing (499), but the
  task runs on.
- `stream_detached`: server-sent events. A task runs the event producer (through `sse_stream`, so framing,
  the error event and `[DONE]` are the usual ones) into a buffer; the response sends the buffer as it grows.
  A client that leaves stops the sending, not the producer.
- Either way the request ends only when the work has ended, so what runs when a request ends (the usage
  ledger's row, the rate-limit settlement) counts the whole work, once.
- The `Keeper` hears of the final answer twice (a stream's: its events without heartbeats, `[DONE]`
  included): `answered()` just before the client gets its last bytes (instant: the idempotency keeper
  remembers it in the process, so a retry on the heels of the answer is replayed), and `done()` once the
  client has them (the keeper writes it to the store, off the client's wait); `done(None)` when the task
  itself was cancelled. Neither may raise.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from dataclasses import dataclass
from typing import Any, Protocol

from fastapi import Response
from fastapi.responses import StreamingResponse
from pydantic import BaseModel
from starlette.types import Receive, Scope, Send

from sluicegate.api.envelope import INTERNAL
from sluicegate.api.sse import HEADERS, OPENAI_FRAMING, Framing, SSEResponse, sse_stream
from sluicegate.refusal import Rejected
from sluicegate.serving.errors import ApiError

log = logging.getLogger("sluicegate.detached")

SSE_TYPE = "text/event-stream; charset=utf-8"


@dataclass(frozen=True, slots=True)
class Finished:
    """A detached work's answer: what the client was (or would have been) sent."""

    status: int
    headers: dict[str, str]  # lower-case names
    body: bytes
    error: Rejected | None  # the error this answer carries (a stream's error event), if any


class Keeper(Protocol):
    def answered(self, finished: Finished) -> None:
        """The answer, just before the client gets its last bytes."""

    async def done(self, finished: Finished | None) -> None:
        """The answer once the client has it, or None: the work was cancelled. The request ends after this."""


Render = Callable[[Rejected, str], Response]


class _Answer(Response):
    """A finished answer, sent; then the keeper's `done` (also when sending failed)."""

    def __init__(self, finished: Finished, after: Callable[[], Awaitable[None]]) -> None:
        super().__init__(finished.body, status_code=finished.status, headers=finished.headers)
        self._after = after

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            await self._after()


async def _disconnected(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


async def answer_detached(receive: Receive, finish: Coroutine[Any, Any, Response], *, render: Render,
                          request_id: str, keeper: Keeper) -> Response:
    """Run `finish` in a task of its own; its answer, or 499 when the client left (after the work ended)."""

    async def run() -> Finished:
        error: Rejected | None = None
        try:
            try:
                response = await finish
            except Rejected as exc:
                error, response = exc, render(exc, request_id)
            except Exception:
                log.exception("%s internal error", request_id)
                error = ApiError("internal_error", INTERNAL)
                response = render(error, request_id)
        except BaseException:  # cancelled: no answer to keep
            await asyncio.shield(keeper.done(None))
            raise
        finished = Finished(response.status_code, dict(response.headers), bytes(response.body), error)
        keeper.answered(finished)
        return finished

    task = asyncio.create_task(run())
    watcher = asyncio.ensure_future(_disconnected(receive))
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
    if not task.done():  # the client left; the work goes on, and this request ends with it
        await asyncio.wait({task})
        if not task.cancelled() and task.exception() is None:
            await keeper.done(task.result())
        return Response(status_code=499)
    finished = task.result()
    return _Answer(finished, lambda: keeper.done(finished))


class _Buffer:
    """A stream's events so far, read by one response; `[DONE]` is held back until the work has ended."""

    def __init__(self, last: bytes) -> None:
        self.last = last  # the stream's last event (held back)
        self.chunks: list[bytes] = []
        self.closed = False
        self._changed = asyncio.Event()

    def append(self, chunk: bytes) -> None:
        self.chunks.append(chunk)
        self._changed.set()

    def close(self) -> None:
        self.closed = True
        self._changed.set()

    async def read(self) -> AsyncIterator[bytes]:
        i = 0
        while True:
            while i < len(self.chunks) and (self.closed or self.chunks[i] != self.last):
                yield self.chunks[i]
                i += 1
            if self.closed and i >= len(self.chunks):
                return
            self._changed.clear()
            await self._changed.wait()


class _DetachedStream(SSEResponse):
    """Sends a buffer as it grows; when the response ends (the client left, or all was sent), it waits for
    the work to end before the request does (the module doc says why)."""

    def __init__(self, buffer: _Buffer, work: asyncio.Task[None]) -> None:
        super().__init__(buffer.read(), media_type="text/event-stream", headers=HEADERS)
        self._work = work

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)  # closes the buffer's reader when it ends
        finally:
            await asyncio.wait({self._work})  # never cancels it, never raises what it raised


def stream_detached(items: AsyncIterator[BaseModel | str | None], *, request_id: str,
                    render_error: Callable[[Rejected, str], dict[str, Any]], keeper: Keeper,
                    framing: Framing = OPENAI_FRAMING) -> StreamingResponse:
    """Run the event producer `items` in a task of its own; the response streams what it has produced."""
    errors: list[Rejected] = []

    def capture(exc: Rejected, rid: str) -> dict[str, Any]:
        errors.append(exc)
        return render_error(exc, rid)

    buffer = _Buffer(framing.last)

    async def pump() -> None:
        try:
            async for chunk in sse_stream(items, request_id=request_id, render_error=capture, framing=framing):
                buffer.append(chunk)
        except BaseException:
            buffer.close()
            await asyncio.shield(keeper.done(None))
            raise
        body = b"".join(c for c in buffer.chunks if c != framing.heartbeat)
        headers = {"content-type": SSE_TYPE, **{k.lower(): v for k, v in HEADERS.items()}}
        finished = Finished(200, headers, body, errors[0] if errors else None)
        keeper.answered(finished)
        buffer.close()  # the client may now have `[DONE]`
        await keeper.done(finished)

    return _DetachedStream(buffer, asyncio.create_task(pump()))


__all__ = ["Finished", "Keeper", "Render", "answer_detached", "stream_detached"]
