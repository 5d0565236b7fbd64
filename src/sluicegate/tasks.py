"""Background asyncio tasks: the one way a component stops the task it started (store/notify.py's listener,
the webhook dispatcher, the Redis concurrency lease renewer)."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any


async def cancel(task: asyncio.Task[Any] | None) -> None:
    """Cancel `task` (None: nothing started) and wait until it has ended; its cancellation is not re-raised."""
    if task is None:
        return
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
