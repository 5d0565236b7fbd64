"""The asyncio side of the engine: submit, await deltas, abort when the consumer goes away."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import AsyncIterator

from sluicegate.engine.core import Engine
from sluicegate.engine.types import EngineRequest, RequestOutput


class _Mailbox:
    """Hands the engine thread's outputs to one event loop, one wake-up per burst.

    A step emits one output per running stream. Waking the loop once per output (`call_soon_threadsafe`:
    a write to the loop's wake-up pipe and a pass through its selector each) costs the event loop, and on a
    small machine the forward pass it shares the cores with, once per stream per step; here the first
    output of a burst schedules one drain and the rest of the step's outputs join it.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._lock = threading.Lock()
        self._pending: list[tuple[asyncio.Queue[RequestOutput], RequestOutput]] = []

    def post(self, queue: asyncio.Queue[RequestOutput], out: RequestOutput) -> None:
        with self._lock:
            self._pending.append((queue, out))
            if len(self._pending) > 1:
                return  # a drain is already scheduled and has not run yet
        with contextlib.suppress(RuntimeError):  # the event loop is gone: nobody is listening any more
            self._loop.call_soon_threadsafe(self._drain)

    def _drain(self) -> None:
        with self._lock:
            pending, self._pending = self._pending, []
        for queue, out in pending:
            queue.put_nowait(out)


class AsyncEngine:
    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self._mailboxes: dict[asyncio.AbstractEventLoop, _Mailbox] = {}

    def _mailbox(self, loop: asyncio.AbstractEventLoop) -> _Mailbox:
        box = self._mailboxes.get(loop)
        if box is None:
            for old in [x for x in self._mailboxes if x.is_closed()]:
                del self._mailboxes[old]
            box = self._mailboxes[loop] = _Mailbox(loop)
        return box

    async def stream(self, request: EngineRequest) -> AsyncIterator[RequestOutput]:
        """Yield the request's deltas; the last has `finished=True`.

        If the consumer stops early (client disconnect, task cancelled), the request is aborted in the
        engine, which frees its slot within one step.
        """
        queue: asyncio.Queue[RequestOutput] = asyncio.Queue()
        box = self._mailbox(asyncio.get_running_loop())

        def sink(out: RequestOutput) -> None:
            box.post(queue, out)

        self.engine.submit(request, sink)
        finished = False
        try:
            while not finished:
                out = await queue.get()
                finished = out.finished
                yield out
        finally:
            if not finished:
                self.engine.abort(request.request_id)

    async def generate(self, request: EngineRequest) -> RequestOutput:
        """Run to completion and merge the deltas into one result."""
        ids: list[int] = []
        parts: list[str] = []
        logprobs = []
        async for out in self.stream(request):
            ids.extend(out.new_token_ids)
            parts.append(out.text)
            logprobs.extend(out.logprobs)
            if out.finished:
                out.new_token_ids, out.text, out.logprobs = ids, "".join(parts), logprobs
                return out
        raise RuntimeError("the engine ended a stream without a final output")  # pragma: no cover
