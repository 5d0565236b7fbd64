"""Opening the store: a SQLAlchemy engine and session factory for a URL (SQLite by default, Postgres by URL).

Store access is synchronous SQLAlchemy. Callers on the event loop run it in a thread (`asyncio.to_thread`);
the hot path (authenticating a request) reads an in-process cache instead (tenancy/key_cache.py).
"""

from __future__ import annotations

import datetime as dt
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, create_engine, event, text
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session, sessionmaker
from sqlalchemy.pool import StaticPool

from sluicegate import redaction

DB_FILE = "sluicegate.db"  # the SQLite file's name under the data directory


def default_url(data_dir: Path) -> str:
    """The SQLite file under `data_dir` (the directory is created, private to its owner, when first used)."""
    return f"sqlite:///{Path(data_dir).expanduser().resolve() / DB_FILE}"


class UnknownCursor(LookupError):
    """A list's `after` names nothing of the calling key: an unknown id and another key's answer alike, so a
    cursor never tells whether another key's object exists."""


def resolve_url(database_url: str | None, data_dir: Path) -> str:
    return database_url if database_url else default_url(data_dir)


def display_url(url: str | URL) -> str:
    """The URL with its password and query values masked: safe for a log line or an error message
    (sluicegate/redaction.py)."""
    return redaction.database_url(url if isinstance(url, str) else url.render_as_string(hide_password=False))


def is_sqlite(url: str | URL) -> bool:
    return make_url(url).get_backend_name() == "sqlite"


class _TakeTurns(StaticPool):
    """One shared connection (an in-memory SQLite database exists per connection) that threads take in turn.

    SQLite cannot carry two transactions on one connection: two threads using it at once see each other's
    BEGIN, COMMIT and ROLLBACK ("cannot rollback - no transaction is active", writes rolled back by another
    thread's rollback). The connection is held from checkout to checkin, so one session at a time uses it; the
    lock is re-entrant, since a thread may nest sessions. Acquired in `_do_get`, not in a `checkout` event:
    the pool records the holder before that event fires, so a release there would come too late.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._turn = threading.RLock()

    def _do_get(self) -> Any:
        self._turn.acquire()
        try:
            return super()._do_get()
        except BaseException:
            self._turn.release()
            raise

    def _do_return_conn(self, record: Any) -> None:
        try:
            super()._do_return_conn(record)
        finally:
            self._turn.release()


def _sqlite_pragmas(dbapi_conn: Any, _record: Any) -> None:
    """WAL lets key lookups read while the usage ledger writes; foreign keys are off in SQLite by default."""
    cur = dbapi_conn.cursor()
    cur.execute("PRAGMA foreign_keys=ON")
    cur.execute("PRAGMA busy_timeout=30000")
    mode = cur.execute("PRAGMA journal_mode").fetchone()
    if mode and str(mode[0]).lower() != "memory":
        cur.execute("PRAGMA journal_mode=WAL")
    cur.close()


def _sqlite_relaxed(dbapi_conn: Any, _record: Any) -> None:
    cur = dbapi_conn.cursor()
    cur.execute("PRAGMA synchronous=NORMAL")  # in WAL mode: no fsync per commit; safe against a process crash
    cur.close()


def sqlite_relaxed_setup(dbapi_conn: Any) -> None:
    """A raw sqlite3 connection set up as the relaxed engine sets up its own (tenancy/sqlite_claims.py)."""
    _sqlite_pragmas(dbapi_conn, None)
    _sqlite_relaxed(dbapi_conn, None)


def make_engine(url: str | URL, *, relaxed: bool = False) -> Engine:
    """An engine for the store at `url`.

    `relaxed` is for rows whose loss in an operating-system crash is harmless and whose writes sit on a
    request's path (idempotency claims: a lost one only means a retry runs again, as without a key): a commit
    does not wait for the disk (SQLite `synchronous=NORMAL` in WAL mode, Postgres `synchronous_commit=off`;
    both survive a crash of the process or of the database server's processes, not of the machine),
    connections are not pinged before use (a round trip each), so the caller retries once on a dropped one,
    and every statement commits by itself (autocommit: no BEGIN and COMMIT round trips), so the caller writes
    only statements that stand alone.
    """
    u = make_url(url)
    relax: dict[str, Any] = {"isolation_level": "AUTOCOMMIT"} if relaxed else {}
    if u.get_backend_name() != "sqlite":
        if relaxed and u.get_backend_name() == "postgresql":
            relax["connect_args"] = {"options": "-c synchronous_commit=off"}
        return create_engine(u, pool_pre_ping=not relaxed, hide_parameters=True, **relax)
    # hide_parameters: a failed statement's message (logged) never carries the values bound to it
    kwargs: dict[str, Any] = {"connect_args": {"check_same_thread": False, "timeout": 30}, "hide_parameters": True,
                              **relax}
    if u.database in (None, "", ":memory:"):
        kwargs["poolclass"] = _TakeTurns  # one shared connection, used by one session at a time
    else:
        path = Path(u.database).expanduser()
        if not path.parent.exists():
            path.parent.mkdir(parents=True, mode=0o700)
    engine = create_engine(u, **kwargs)
    event.listen(engine, "connect", _sqlite_pragmas)
    if relaxed:
        event.listen(engine, "connect", _sqlite_relaxed)
    return engine


CLOCK_REFRESH_S = 30.0  # how often `Store.now` measures the database's clock again


@dataclass(slots=True)
class Clock:
    """This machine's clock (`local`, Unix seconds) and its offset to the database's."""

    local: Callable[[], float] = time.time
    offset_s: float = 0.0  # the database's clock minus this machine's
    measured_at: float = -1e18  # monotonic
    lock: threading.Lock = field(default_factory=threading.Lock)


@dataclass(slots=True)
class Store:
    """An open store: the engine, a session factory, and the URL it was opened with.

    `now()` is the time on the database's clock: leases, claims and their expiry compare times written by
    every replica, so they must all read one clock, not each its own (a replica 45 s ahead took others'
    leases). On Postgres it is this machine's clock corrected by the offset to the server's
    (`clock_timestamp()`, measured every `CLOCK_REFRESH_S` from the middle of the round trip, so within half
    a round trip); a SQLite file lives on this machine, whose clock it is. Hand-written rather than `now()` in
    each statement: SQLite has no interval arithmetic, and one offset serves every statement of both.
    """

    engine: Engine
    sessions: sessionmaker[Session]
    clock: Clock = field(default_factory=Clock)

    @classmethod
    def open(cls, url: str | URL) -> Store:
        engine = make_engine(url)
        return cls(engine, sessionmaker(engine, expire_on_commit=False))

    @property
    def url(self) -> URL:
        return self.engine.url

    @property
    def is_sqlite(self) -> bool:
        return self.engine.dialect.name == "sqlite"

    def session(self) -> Session:
        return self.sessions()

    def now(self) -> dt.datetime:
        """UTC now, on the database's clock (the class doc). A measurement that fails keeps the last offset:
        the statement that follows fails the same way, and says so."""
        c = self.clock
        local = dt.datetime.fromtimestamp(c.local(), dt.UTC)
        if self.is_sqlite:
            return local
        if time.monotonic() - c.measured_at >= CLOCK_REFRESH_S and c.lock.acquire(blocking=False):
            try:
                c.offset_s = self._measure_offset()
                c.measured_at = time.monotonic()
            except SQLAlchemyError:
                pass
            finally:
                c.lock.release()
        return local + dt.timedelta(seconds=c.offset_s)

    def _measure_offset(self) -> float:
        with self.engine.connect() as conn:
            before = self.clock.local()
            theirs = conn.execute(text("SELECT clock_timestamp()")).scalar_one()
            after = self.clock.local()
        return float(theirs.timestamp() - (before + after) / 2)

    def close(self) -> None:
        self.engine.dispose()


def in_memory() -> Store:
    """A private in-memory SQLite store, migrated to head: the app's store when it is given none (tests)."""
    from sluicegate.store.migrate import upgrade_engine

    store = Store.open("sqlite://")
    upgrade_engine(store.engine)
    return store


__all__ = ["DB_FILE", "Clock", "Store", "default_url", "display_url", "in_memory", "is_sqlite", "make_engine",
           "resolve_url", "sqlite_relaxed_setup"]
