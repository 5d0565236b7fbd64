"""API keys: a request-rate limit, a concurrency limit and a monthly token budget beside the token rate.

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-03
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # nullable columns added in place: SQLite and Postgres both take them without rewriting the table
    op.add_column("api_keys", sa.Column("rpm", sa.Integer(), nullable=True))
    op.add_column("api_keys", sa.Column("max_concurrent", sa.Integer(), nullable=True))
    op.add_column("api_keys", sa.Column("monthly_tokens", sa.BigInteger(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("api_keys") as batch:
        batch.drop_column("monthly_tokens")
        batch.drop_column("max_concurrent")
        batch.drop_column("rpm")
