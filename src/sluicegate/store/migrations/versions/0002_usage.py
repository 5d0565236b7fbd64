"""The usage ledger.

Revision ID: 0002
Revises: 0001
Create Date: 2025-06-01
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "usage",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), autoincrement=True, nullable=False),
        sa.Column("key_id", sa.String(32), nullable=True),
        sa.Column("day", sa.Date(), nullable=False),
        sa.Column("route", sa.String(64), nullable=False),
        sa.Column("status", sa.Integer(), nullable=False),
        sa.Column("prompt_tokens", sa.Integer(), nullable=False),
        sa.Column("cached_tokens", sa.Integer(), nullable=False),
        sa.Column("generated_tokens", sa.Integer(), nullable=False),
        sa.Column("request_id", sa.String(128), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["key_id"], ["api_keys.id"], name="fk_usage_key_id_api_keys"),
        sa.PrimaryKeyConstraint("id", name="pk_usage"),
    )
    op.create_index("ix_usage_key_id_day", "usage", ["key_id", "day"])
    op.create_index("ix_usage_day", "usage", ["day"])


def downgrade() -> None:
    op.drop_index("ix_usage_day", table_name="usage")
    op.drop_index("ix_usage_key_id_day", table_name="usage")
    op.drop_table("usage")
