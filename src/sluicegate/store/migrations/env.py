"""Alembic's environment for sluicegate: always online, on the connection sluicegate hands it."""

from __future__ import annotations

from alembic import context

from sluicegate.store.models import Base

connection = context.config.attributes.get("connection")
if connection is None or context.is_offline_mode():
    raise RuntimeError("sluicegate runs its migrations through sluicegate.store.migrate (sluicegate db upgrade)")

# render_as_batch: SQLite cannot ALTER most things; batch mode rebuilds the table there and alters elsewhere.
context.configure(connection=connection, target_metadata=Base.metadata, render_as_batch=True, compare_type=True)
with context.begin_transaction():
    context.run_migrations()
