"""Databases for tests: a SQLite file, and a fresh Postgres database on the machine's server.

Postgres: `SLUICEGATE_TEST_POSTGRES` (default `postgresql+psycopg://postgres@127.0.0.1:5432/test`) names a
database to connect to; each session (and each test that needs an empty one) creates its own
`sluicegate_t_<random>` beside it and drops it afterwards. Without a reachable server the Postgres cases are
skipped, with the reason.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.engine import URL, make_url

ADMIN_URL = os.environ.get("SLUICEGATE_TEST_POSTGRES", "postgresql+psycopg://postgres@127.0.0.1:5432/test")
BACKENDS = ["sqlite", "postgres"]
_unreachable: str | None = None


def postgres_unreachable() -> str | None:
    """Why Postgres cannot be used (checked once), or None."""
    global _unreachable
    if _unreachable is None:
        engine = create_engine(ADMIN_URL)
        try:
            with engine.connect() as conn:
                conn.execute(text("select 1"))
            _unreachable = ""
        except Exception as exc:
            shown = make_url(ADMIN_URL).render_as_string()
            _unreachable = f"Postgres is not reachable at {shown}: {type(exc).__name__}"
        finally:
            engine.dispose()
    return _unreachable or None


@contextmanager
def postgres_database() -> Iterator[URL]:
    """A new, empty database on the test server; dropped (connections and all) afterwards."""
    reason = postgres_unreachable()
    if reason:
        pytest.skip(reason)
    name = f"sluicegate_t_{secrets.token_hex(6)}"
    admin = create_engine(ADMIN_URL, isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as conn:
            conn.execute(text(f'CREATE DATABASE "{name}"'))
        yield make_url(ADMIN_URL).set(database=name)
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


def sqlite_url(directory: Path) -> str:
    return f"sqlite:///{directory / f'store-{secrets.token_hex(4)}.db'}"


def url_string(url: URL | str) -> str:
    """A URL as a string a subprocess or `create_engine` takes (the password, if any, kept)."""
    return url if isinstance(url, str) else url.render_as_string(hide_password=False)


def truncate(url: str) -> None:
    """Empty the store's tables (Postgres session database: each test starts with no key)."""
    engine = create_engine(url)
    try:
        with engine.begin() as conn:
            conn.execute(text("TRUNCATE usage, idempotency_keys, api_keys, predictions, webhook_deliveries, "
                              "webhook_endpoints"))
    finally:
        engine.dispose()
