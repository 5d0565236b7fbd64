"""Store faults on the real Postgres, confined to one test database (the server and every other database go on):

- `refusing(url)`: the database takes no connection (`ALLOW_CONNECTIONS false`) and its open ones are ended, as
  a stopped server looks to its clients;
- `read_only(url)`: reads work, every write fails (`default_transaction_read_only`), as a replica promoted
  wrongly or a full disk looks.

Both undo themselves on exit and end the connections again, so the pool's next ones see the database as it is.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager

from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from tests.dbs import ADMIN_URL


def _admin(sql: list[str], name: str) -> None:
    engine = create_engine(ADMIN_URL, isolation_level="AUTOCOMMIT")
    try:
        with engine.connect() as conn:
            for statement in sql:
                conn.execute(text(statement))
            conn.execute(text("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                              "WHERE datname = :name AND pid <> pg_backend_pid()"), {"name": name})
    finally:
        engine.dispose()


@contextmanager
def _altered(url: str, fault: str, undo: str) -> Iterator[None]:
    """The test database `url` with `fault` (an ALTER DATABASE clause) in force, then `undo`ne."""
    name = make_url(url).database
    assert name and name.startswith("sluicegate_t_"), "only a test database may be faulted"
    _admin([f'ALTER DATABASE "{name}" {fault}'], name)
    try:
        yield
    finally:
        _admin([f'ALTER DATABASE "{name}" {undo}'], name)


def refusing(url: str) -> AbstractContextManager[None]:
    return _altered(url, "WITH ALLOW_CONNECTIONS false", "WITH ALLOW_CONNECTIONS true")


def read_only(url: str) -> AbstractContextManager[None]:
    return _altered(url, "SET default_transaction_read_only = on", "RESET default_transaction_read_only")
