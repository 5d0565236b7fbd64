"""The asyncio side of the engine: submit, await deltas, abort when the consumer goes away."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

from sluicegate.engine.core import Engine
from sluicegate.engine.types import EngineRequest, RequestOutput


class AsyncEngine:
    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    async def stream(self, request: EngineRequest) -> AsyncIterator[RequestOutput]:
        """Yield the request's deltas; the last has `finished=True`.

        If the consumer stops early (client disconnect, task cancelled), the request is aborted in the
        engine, which frees its slot within one step.
        """
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[RequestOutput] = asyncio.Queue()

        def sink(out: RequestOutput) -> None:
            with contextlib.suppress(RuntimeError):  # the event loop is gone: nobody is listening any more
                loop.call_soon_threadsafe(queue.put_nowait, out)

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
