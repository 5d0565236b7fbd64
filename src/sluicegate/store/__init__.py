"""Persistence: SQLAlchemy 2 models, Alembic migrations shipped in the package, SQLite by default, Postgres by URL.

Nothing here knows HTTP; `tenancy/` (keys, the usage ledger) is built on it, and `api/` on that.
"""

from sluicegate.store.db import Store, default_url, display_url, in_memory, is_sqlite, resolve_url
from sluicegate.store.migrate import SchemaState, SchemaStatus, ensure_current, head_revision, schema_state, upgrade

__all__ = ["SchemaState", "SchemaStatus", "Store", "default_url", "display_url", "ensure_current", "head_revision",
           "in_memory", "is_sqlite", "resolve_url", "schema_state", "upgrade"]
