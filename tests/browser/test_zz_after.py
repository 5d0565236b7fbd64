"""Runs after the browser tests (pytest orders files by name): no event loop is left running in this thread."""

from __future__ import annotations

import asyncio


def test_asyncio_run_works_after_the_browser_tests() -> None:
    async def answer() -> int:
        return 42

    assert asyncio.run(answer()) == 42
