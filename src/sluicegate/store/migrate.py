"""Alembic, configured in code (no alembic.ini): upgrade a store, and check it is at the code's head revision.

The migration scripts ship inside the package (`store/migrations/`, package data), so an installed
sluicegate can upgrade its own database: `sluicegate db upgrade [--database-url URL]`. `serve` applies them
itself on SQLite (a file only this deployment uses) and refuses to start on any other database whose schema
is not at head, naming that command: a shared Postgres is upgraded once, deliberately, not by whichever
replica starts first.

A new revision: `PYTHONPATH=src python -c "from sluicegate.store.migrate import new_revision; new_revision('add
idempotency')"` writes `migrations/versions/0003_add_idempotency.py` to fill in (keep `models.py` in step).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from pathlib import Path

from alembic import command
from alembic.config import Config as AlembicConfig
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Connection, Engine
from sqlalchemy.engine import URL

from sluicegate.store.db import display_url, make_engine

MIGRATIONS = Path(__file__).resolve().parent / "migrations"


def alembic_config(connection: Connection | None = None) -> AlembicConfig:
    cfg = AlembicConfig()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    cfg.set_main_option("path_separator", "os")
    cfg.attributes["connection"] = connection
    return cfg


def head_revision() -> str:
    head = ScriptDirectory.from_config(alembic_config()).get_current_head()
    assert head is not None, "the package ships no migrations"
    return head


class SchemaStatus(enum.Enum):
    CURRENT = "current"  # at the code's head revision
    EMPTY = "empty"  # never migrated (no alembic_version table, or no row in it)
    BEHIND = "behind"  # an older revision of this code's history
    UNKNOWN = "unknown"  # a revision this code does not know: written by a newer sluicegate


@dataclass(frozen=True, slots=True)
class SchemaState:
    status: SchemaStatus
    current: str | None
    head: str

    def refusal(self, url: str | URL) -> str | None:
        """Why `serve` will not start on this schema, with the command that fixes it; None when current."""
        shown = display_url(url)
        if self.status is SchemaStatus.CURRENT:
            return None
        if self.status is SchemaStatus.UNKNOWN:
            return (f"the database at {shown} is at revision {self.current}, which this sluicegate does not know "
                    f"(its newest is {self.head}): it was migrated by a newer version; run that version")
        at = "has no sluicegate schema" if self.status is SchemaStatus.EMPTY else f"is at revision {self.current}"
        return (f"the database at {shown} {at}; this sluicegate needs revision {self.head}. "
                f"Run: sluicegate db upgrade --database-url {shown}")


def schema_state(engine: Engine) -> SchemaState:
    head = head_revision()
    with engine.connect() as conn:
        current = MigrationContext.configure(conn).get_current_revision()
    if current is None:
        return SchemaState(SchemaStatus.EMPTY, None, head)
    if current == head:
        return SchemaState(SchemaStatus.CURRENT, current, head)
    script = ScriptDirectory.from_config(alembic_config())
    known = {rev.revision for rev in script.walk_revisions()}
    return SchemaState(SchemaStatus.BEHIND if current in known else SchemaStatus.UNKNOWN, current, head)


def upgrade_engine(engine: Engine, revision: str = "head") -> None:
    with engine.begin() as conn:
        command.upgrade(alembic_config(conn), revision)


def upgrade(url: str | URL, revision: str = "head") -> SchemaState:
    """Apply the migrations up to `revision` (default: head); returns the state afterwards."""
    engine = make_engine(url)
    try:
        upgrade_engine(engine, revision)
        return schema_state(engine)
    finally:
        engine.dispose()


def ensure_current(engine: Engine, *, auto_upgrade: bool) -> SchemaState:
    """Upgrade when allowed (SQLite) and the schema is behind; return the state the caller must check.

    Two processes upgrading one SQLite file at once: SQLite runs DDL outside a transaction, so the slower one
    may fail on a table the faster one just created; it then finds the schema current and carries on.
    """
    state = schema_state(engine)
    if not auto_upgrade or state.status not in (SchemaStatus.EMPTY, SchemaStatus.BEHIND):
        return state
    try:
        upgrade_engine(engine)
    except Exception:
        state = schema_state(engine)
        if state.status is not SchemaStatus.CURRENT:
            raise
        return state
    return schema_state(engine)


def new_revision(message: str) -> None:  # pragma: no cover - a developer tool
    """Write the next revision's file (`0003_<message>.py`, ...) for a developer to fill in."""
    head = head_revision()
    command.revision(alembic_config(), message=message, rev_id=f"{int(head) + 1:04d}" if head.isdigit() else None)


__all__ = ["MIGRATIONS", "SchemaState", "SchemaStatus", "alembic_config", "ensure_current", "head_revision",
           "schema_state", "upgrade", "upgrade_engine"]
