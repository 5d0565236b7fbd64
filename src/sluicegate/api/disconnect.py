"""Run a handler's work, and cancel it the moment the client disconnects."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Coroutine
from typing import Any, TypeVar

from starlette.types import Receive

T = TypeVar("T")


class ClientDisconnected(Exception):
    """The client left before the answer was ready; the work was cancelled."""


async def unless_disconnected(receive: Receive, work: Coroutine[Any, Any, T]) -> T:
    """Await `work` while watching the connection; cancelling `work` aborts its engine request."""
    task = asyncio.ensure_future(work)

    async def watch() -> None:
        while (await receive())["type"] != "http.disconnect":
            pass

    watcher = asyncio.ensure_future(watch())
    try:
        done, _ = await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
    if task in done:
        return task.result()
    task.cancel()
    with contextlib.suppress(BaseException):  # the result no longer matters
        await task
    raise ClientDisconnected
