"""The one polling helper the tests share: it returns the predicate's value, and fails naming what it awaited."""

from __future__ import annotations

import asyncio
import itertools

import pytest

from sluicegate.testing.wait import wait_for, wait_for_async


def test_returns_the_first_truthy_value() -> None:
    calls = itertools.count(1)
    assert wait_for(lambda: (n := next(calls)) >= 3 and n, interval=0) == 3


def test_a_timeout_fails_naming_what_was_awaited() -> None:
    seen: list[int] = []
    with pytest.raises(AssertionError, match=r"timed out after 0 s waiting for the moon"):
        wait_for(lambda: seen.append(1), 0, message="the moon")
    assert seen == [1]  # checked once even with no time at all


def test_an_exception_in_the_predicate_propagates() -> None:
    def boom() -> bool:
        raise RuntimeError("exited")

    with pytest.raises(RuntimeError, match="exited"):
        wait_for(boom)


def test_the_async_form_lets_the_loop_run() -> None:
    async def main() -> str:
        done = asyncio.Event()
        asyncio.get_running_loop().call_soon(done.set)
        await wait_for_async(done.is_set, interval=0)
        with pytest.raises(AssertionError, match="never"):
            await wait_for_async(lambda: False, 0, message="never")
        return "ok"

    assert asyncio.run(main()) == "ok"
