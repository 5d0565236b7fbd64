"""Idempotency claims on Postgres from the event loop: psycopg's asynchronous connections, no thread hop.

A claim is on the path of every request carrying an Idempotency-Key. Run in a worker thread it costs the
statements (one round trip each, ~0.3 ms) plus the hop to the thread and back, which on a busy two-core
machine costs more than the statements (docs/benchmarks.md, "Tenancy cost per request"). Here the same
statements (built once by SQLAlchemy for the psycopg dialect, so the SQL is the store's own) run on a pool
of asynchronous connections (`psycopg_pool.AsyncConnectionPool`) of the event loop that first uses it:
autocommit, `synchronous_commit=off`, like the thread's engine (`make_engine(relaxed=True)`).

The claim's logic is not here: `IdempotencyStore._claim_steps` yields each statement and takes its result,
and this module only runs them. SQLAlchemy's own asyncio layer would do it too, but needs greenlet and an
async engine beside the synchronous one for three statements.
"""

from __future__ import annotations

import asyncio
from typing import Any

from psycopg import OperationalError
from psycopg.rows import namedtuple_row
from psycopg_pool import AsyncConnectionPool
from sqlalchemy import ClauseElement
from sqlalchemy.engine import URL, Dialect

MAX_CONNECTIONS = 8  # per process: claims are one or three short statements each


class PgClaims:
    """The claim's statements as SQL for psycopg, and the pool that runs them (opened on first use)."""

    def __init__(self, url: URL, dialect: Dialect, statements: dict[str, tuple[ClauseElement, list[str]]]) -> None:
        """`statements`: op -> (statement, the column keys its values take, for an INSERT or UPDATE)."""
        self._conninfo = url.set(drivername="postgresql").render_as_string(hide_password=False)
        self._sql = {op: str(stmt.compile(dialect=dialect, column_keys=keys or None))
                     for op, (stmt, keys) in statements.items()}
        self._pool: AsyncConnectionPool[Any] | None = None
        self._opening: asyncio.Future[None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def usable(self) -> bool:
        """Only on the event loop that opened the pool (its connections belong to that loop)."""
        loop = asyncio.get_running_loop()
        return self._loop is None or self._loop is loop

    async def run(self, steps: Any) -> Any:
        """Run a generator of (op, params) on one connection, sending each result back; returns its value.
        A connection that dropped is retried once by the caller's rule (`retry` makes fresh steps)."""
        pool = await self._open()
        async with pool.connection() as conn:
            try:
                op, params = next(steps)
                while True:
                    cur = await conn.execute(self._sql[op], params)
                    if op == "insert":
                        result: Any = await cur.fetchone() is not None
                    elif op == "read":
                        result = await cur.fetchone()
                    else:
                        result = cur.rowcount
                    op, params = steps.send(result)
            except StopIteration as done:
                return done.value

    async def _open(self) -> AsyncConnectionPool[Any]:
        if self._pool is None:
            self._loop = asyncio.get_running_loop()
            self._pool = AsyncConnectionPool(
                self._conninfo, min_size=1, max_size=MAX_CONNECTIONS, open=False, timeout=10,
                kwargs={"autocommit": True, "row_factory": namedtuple_row,
                        "options": "-c synchronous_commit=off"},
            )
            self._opening = asyncio.ensure_future(self._pool.open(wait=True, timeout=10))
        pool, opening = self._pool, self._opening
        assert opening is not None
        try:
            await asyncio.shield(opening)
        except Exception:
            if self._pool is pool:  # the database was unreachable: the next claim tries again
                self._pool = self._opening = None
                await pool.close()
            raise
        return pool

    async def close(self) -> None:
        if self._pool is not None:
            pool, self._pool = self._pool, None
            await pool.close()


__all__ = ["OperationalError", "PgClaims"]
