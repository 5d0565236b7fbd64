"""The asyncio side of the engine: submit runs, collect their outputs, abort what nobody reads any more.

The path of one output, engine thread to response writer:

    engine sink --(one call_soon_threadsafe per step, _Mailbox)--> OutputCollector.put --> consumer's get()

Two hand-offs, no task per request or per event: the mailbox wakes the event loop once per engine step
whatever the number of streams, and each API request's `OutputCollector` (vLLM v1's
`RequestOutputCollector` idea) holds at most one pending delta per run, merging new deltas into it when the
consumer has not taken the last one yet, so a slow reader costs one merge, never a queue that grows.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import AsyncIterator, Sequence

from sluicegate.engine.core import Engine, Sink
from sluicegate.engine.types import EngineRequest, RequestOutput


def merge_into(acc: RequestOutput, out: RequestOutput) -> None:
    """Fold the delta `out` into `acc` (the older pending delta of the same run): text, ids and logprobs
    concatenate; the final fields (reason, usage, timing) come from `out` once it is the last."""
    acc.new_token_ids.extend(out.new_token_ids)
    acc.text += out.text
    acc.logprobs.extend(out.logprobs)
    if out.finished:
        acc.finished, acc.finish_reason, acc.error = True, out.finish_reason, out.error
        acc.error_type, acc.retry_after = out.error_type, out.retry_after
        acc.prompt_tokens, acc.cached_tokens = out.prompt_tokens, out.cached_tokens
        acc.completion_tokens, acc.seed, acc.timing = out.completion_tokens, out.seed, out.timing


class OutputCollector:
    """The outputs of one API request's runs (n choices, several prompts), for one consumer on one loop.

    `put` is called on the event loop (by the mailbox's drain); `get` returns every run's pending delta,
    in the order the runs first produced one since the last `get`.
    """

    __slots__ = ("_event", "_pending", "n_runs")

    def __init__(self, n_runs: int) -> None:
        self.n_runs = n_runs
        self._pending: dict[int, RequestOutput] = {}
        self._event = asyncio.Event()

    def put(self, index: int, out: RequestOutput) -> None:
        acc = self._pending.get(index)
        if acc is None:
            self._pending[index] = out
        else:
            merge_into(acc, out)
        self._event.set()

    async def get(self, timeout: float | None = None) -> list[tuple[int, RequestOutput]]:
        """Wait for output; an empty list means `timeout` seconds passed without any (a heartbeat's cue).

        The timeout is a timer that sets the event, not a task: nothing is created per call.
        """
        if not self._pending:
            if timeout is None:
                await self._event.wait()
            else:
                handle = asyncio.get_running_loop().call_later(timeout, self._event.set)
                try:
                    await self._event.wait()
                finally:
                    handle.cancel()
        self._event.clear()
        pending, self._pending = self._pending, {}
        return list(pending.items())


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
        self._pending: list[tuple[OutputCollector, int, RequestOutput]] = []

    def post(self, collector: OutputCollector, index: int, out: RequestOutput) -> None:
        with self._lock:
            self._pending.append((collector, index, out))
            if len(self._pending) > 1:
                return  # a drain is already scheduled and has not run yet
        with contextlib.suppress(RuntimeError):  # the event loop is gone: nobody is listening any more
            self._loop.call_soon_threadsafe(self._drain)

    def _drain(self) -> None:
        with self._lock:
            pending, self._pending = self._pending, []
        for collector, index, out in pending:
            collector.put(index, out)


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

    def submit(self, requests: Sequence[EngineRequest]) -> OutputCollector:
        """Submit every run of one API request (call on the event loop); run i's outputs reach the collector
        under index i. All or nothing: if the engine refuses one (`EngineOverloaded`, `EngineStopped`), the
        runs already queued are aborted and the refusal raises here, before any output exists."""
        collector = OutputCollector(len(requests))
        box = self._mailbox(asyncio.get_running_loop())
        submitted: list[str] = []
        try:
            for i, request in enumerate(requests):
                self.engine.submit(request, _sink(box, collector, i))
                submitted.append(request.request_id)
        except BaseException:
            for request_id in submitted:
                self.engine.abort(request_id)
            raise
        return collector

    def abort(self, request_id: str) -> None:
        self.engine.abort(request_id)

    async def stream(self, request: EngineRequest) -> AsyncIterator[RequestOutput]:
        """Yield one request's (merged) deltas; the last has `finished=True`.

        If the consumer stops early (client disconnect, task cancelled), the request is aborted in the
        engine, which frees its slot within one step.
        """
        collector = self.submit([request])
        finished = False
        try:
            while not finished:
                for _, out in await collector.get():
                    finished = out.finished
                    yield out
        finally:
            if not finished:
                self.engine.abort(request.request_id)

    async def generate(self, request: EngineRequest) -> RequestOutput:
        """Run to completion and return the whole result (one merged output)."""
        acc: RequestOutput | None = None
        async for out in self.stream(request):
            if acc is None:
                acc = out
            else:
                merge_into(acc, out)
        assert acc is not None and acc.finished
        return acc


def _sink(box: _Mailbox, collector: OutputCollector, index: int) -> Sink:
    def sink(out: RequestOutput) -> None:
        box.post(collector, index, out)

    return sink

