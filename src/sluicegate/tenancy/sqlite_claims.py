"""Idempotency claims (and answers) on a SQLite file from the event loop: the driver's connection directly.

A claim is on the path of every request carrying an Idempotency-Key, and on SQLite it runs on the event loop
when the file's write lock is free (tenancy/idempotency.py). Its insert costs ~0.03 ms in sqlite3 and ~0.11 ms
through SQLAlchemy's Connection (the pool's checkout and return, the execution context, the result object),
measured side by side in one process (docs/benchmarks.md, "Tenancy cost per request"); on a request whose
whole tenancy budget is 0.3 ms that difference matters. So the claim's statements, built once by SQLAlchemy
for the SQLite dialect (the SQL is the store's own), run here on one `sqlite3` connection kept open, with the
columns' own conversions (SQLAlchemy's bind and result processors of each column's type, so a timestamp is
written and read exactly as the store's engine does).

The claim's logic is not here: `IdempotencyStore._claim_steps` yields each statement and takes its result,
as for Postgres (tenancy/pg_claims.py). A statement never waits for the file's lock (`busy_timeout=0`): one
that meets another writer raises `Busy` at once, nothing changed, and the caller takes the thread's path.
"""

from __future__ import annotations

import sqlite3
import threading
from collections import namedtuple
from collections.abc import Callable
from typing import Any

from sqlalchemy import ClauseElement, Select
from sqlalchemy.dialects import sqlite
from sqlalchemy.engine import Dialect
from sqlalchemy.sql.compiler import SQLCompiler

Processor = Callable[[Any], Any]


class Busy(Exception):
    """The file's write lock is held by another connection (or this one is in use): nothing was changed."""


class _Statement:
    """One statement as SQL with named parameters, the bind conversion of each parameter, and (a SELECT)
    the row type with each column's result conversion."""

    def __init__(self, stmt: ClauseElement, keys: list[str], dialect: Dialect) -> None:
        compiled = stmt.compile(dialect=dialect, column_keys=keys or None)
        assert isinstance(compiled, SQLCompiler)
        self.sql = str(compiled)
        self.binds: list[tuple[str, Processor | None]] = [
            (name, bind.type.dialect_impl(dialect).bind_processor(dialect)) for name, bind in compiled.binds.items()
        ]
        self.row: Any = None
        self.results: list[Processor | None] = []
        if isinstance(stmt, Select):
            cols = list(stmt.selected_columns)
            self.row = namedtuple("Row", [c.key for c in cols])  # type: ignore[misc]
            self.results = [c.type.dialect_impl(dialect).result_processor(dialect, None) for c in cols]

    def params(self, values: dict[str, Any]) -> dict[str, Any]:
        return {name: (conv(values[name]) if conv is not None else values[name]) for name, conv in self.binds}

    def read(self, row: tuple[Any, ...] | None) -> Any:
        if row is None:
            return None
        return self.row(*(conv(v) if conv is not None else v for conv, v in zip(self.results, row, strict=True)))


class SqliteClaims:
    """The claim's statements for sqlite3, and the one connection that runs them (opened on first use)."""

    def __init__(self, path: str, statements: dict[str, tuple[ClauseElement, list[str]]],
                 on_connect: Callable[[sqlite3.Connection], None]) -> None:
        """`path`: the database file; `statements`: op -> (statement, the column keys its values take, for an
        INSERT or UPDATE); `on_connect` sets the connection up as the store's engine sets up its own."""
        dialect = sqlite.dialect(paramstyle="named")
        self._path = path
        self._statements = {op: _Statement(stmt, keys, dialect) for op, (stmt, keys) in statements.items()}
        self._on_connect = on_connect
        self._conn: sqlite3.Connection | None = None
        self._turn = threading.Lock()  # the connection is used by one caller at a time; another gets Busy

    def run(self, steps: Any) -> Any:
        """Run a generator of (op, params) on the connection, sending each result back (an insert: whether it
        landed; a read: the row or None; an update: rows changed); returns the generator's value."""
        if not self._turn.acquire(blocking=False):
            raise Busy
        try:
            conn = self._connect()
            op, params = next(steps)
            while True:
                st = self._statements[op]
                try:
                    cur = conn.execute(st.sql, st.params(params))
                except sqlite3.OperationalError as exc:
                    if "locked" in str(exc) or "busy" in str(exc):
                        raise Busy from None
                    raise
                if op == "insert":
                    result: Any = cur.fetchone() is not None
                elif op == "read":
                    result = st.read(cur.fetchone())
                else:
                    result = cur.rowcount
                cur.close()
                op, params = steps.send(result)
        except StopIteration as done:
            return done.value
        finally:
            self._turn.release()

    def _connect(self) -> sqlite3.Connection:
        if self._conn is None:
            conn = sqlite3.connect(self._path, isolation_level=None, check_same_thread=False)  # autocommit
            self._on_connect(conn)
            self._conn = conn
        return self._conn

    def close(self) -> None:
        with self._turn:
            if self._conn is not None:
                self._conn.close()
                self._conn = None


__all__ = ["Busy", "SqliteClaims"]
