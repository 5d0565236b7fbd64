"""The one way tests and the test harnesses wait on state: poll a predicate, bounded in time.

Tests wait on the server's (or engine's) observable state, never on a sleep; the bound is generous because a
loaded machine is slow, not wrong. A timeout is a test failure (`AssertionError`) naming what was awaited.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")

TIMEOUT_S = 120.0
INTERVAL_S = 0.01


def _check(predicate: Callable[[], T], deadline: float, timeout: float, message: str) -> T:
    """One poll: the predicate's value (falsy: not yet), or `AssertionError` once `deadline` has passed."""
    value = predicate()
    if not value and time.monotonic() > deadline:
        raise AssertionError(f"timed out after {timeout:g} s waiting for {message}")
    return value


def wait_for(predicate: Callable[[], T], timeout: float = TIMEOUT_S, *, interval: float = INTERVAL_S,
             message: str = "the condition") -> T:
    """Call `predicate` every `interval` s until it returns something truthy, and return that value.

    Raises `AssertionError` ("timed out after N s waiting for <message>") once `timeout` s have passed; the
    predicate is checked after every sleep, the last included, so a condition that became true during it counts.
    An exception from `predicate` (a process that exited, say) propagates at once.
    """
    deadline = time.monotonic() + timeout
    while not (value := _check(predicate, deadline, timeout, message)):
        time.sleep(interval)
    return value


async def wait_for_async(predicate: Callable[[], T], timeout: float = TIMEOUT_S, *, interval: float = INTERVAL_S,
                         message: str = "the condition") -> T:
    """`wait_for` for a test running on an event loop: sleeps with `asyncio.sleep`, so the loop keeps running."""
    deadline = time.monotonic() + timeout
    while not (value := _check(predicate, deadline, timeout, message)):
        await asyncio.sleep(interval)
    return value
